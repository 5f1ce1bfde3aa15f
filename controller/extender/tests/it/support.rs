//! Builders shared by the extender tests and the benchmark (`#[path]`-included).
#![allow(dead_code)]

use fgpu_api::extender::{ExtenderArgs, ExtenderBindingArgs, Node, Pod};
use fgpu_driver::engine::{self, Gpu};
use fgpu_extender::annotations::render_node_inventory;
use serde_json::{Value, json};

pub const GIB: u64 = 1 << 30;
pub const INVENTORY: &str = "gpu.fgpu.dev/node-gpus";
pub const ASSIGNED: &str = "gpu.fgpu.dev/assigned-devices";

/// A node with `n` GPUs of `model` and `mem_gib` GiB each; GPU i on NUMA node `i / (n/2)`.
pub fn gpu_node(name: &str, n: usize, model: &str, mem_gib: u64) -> Node {
    let gpus = (0..n)
        .map(|i| {
            let mut g = Gpu::new(format!("gpu-{i}"), model, mem_gib * GIB);
            g.uuid = format!("GPU-{name}-{i}");
            g.numa = Some((i / (n / 2).max(1)) as u32);
            g
        })
        .collect();
    let inv = render_node_inventory(&engine::Node::new(name, gpus));
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {INVENTORY: inv}},
        "status": {}
    }))
    .unwrap()
}

/// A pod with one container `main` whose limits are `limits`.
pub fn gpu_pod(name: &str, annotations: Value, limits: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
            "schedulerName": "fgpu-scheduler"},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

/// Sets `pod`'s assignment annotation to `value` as the extender's bind does: the API
/// server then records the extender's field manager as the annotation's owner.
pub fn assign(pod: &mut Pod, value: String) {
    fgpu_extender::writer::record_manager(pod, ASSIGNED, fgpu_extender::writer::FIELD_MANAGER);
    pod.metadata.annotations.insert(ASSIGNED.into(), value);
}

pub fn filter_args(pod: &Pod, nodes: &[&str]) -> ExtenderArgs {
    ExtenderArgs {
        pod: pod.clone(),
        nodes: None,
        node_names: Some(nodes.iter().map(|s| (*s).to_owned()).collect()),
    }
}

pub fn bind_args(pod: &Pod, node: &str) -> ExtenderBindingArgs {
    ExtenderBindingArgs {
        pod_name: pod.metadata.name.clone(),
        pod_namespace: pod.metadata.namespace.clone(),
        pod_uid: pod.metadata.uid.clone(),
        node: node.to_owned(),
    }
}

/// A minimal HTTP/1.1 client on one kept-alive connection (the crate has no HTTP client;
/// this is all the tests need: a request with a body, a response with Content-Length).
pub struct Conn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn open(addr: std::net::SocketAddr) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `method path` with `body`; returns the status and the body.
    pub async fn send(&mut self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // One write: hyper drains an unread body only when it has already arrived, and
        // closes the connection otherwise (a 404 on the metrics port reads no body), so a
        // body sent in a second segment could meet a closed socket.
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.stream.write_all(&request).await.unwrap();
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = vec![0u8; 65536];
            let n = self.stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed before the response head");
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
        let status: u16 = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .expect("content-length");
        while self.buf.len() < end + len {
            let mut chunk = vec![0u8; 65536];
            let n = self.stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed before the response body");
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let body = String::from_utf8_lossy(&self.buf[end..end + len]).to_string();
        self.buf.drain(..end + len);
        (status, body)
    }

    pub async fn post(&mut self, path: &str, body: &str) -> (u16, String) {
        self.send("POST", path, body.as_bytes()).await
    }
}

/// Serves `ext` with `writer` on a free local port; returns the address.
pub async fn start_server<W: fgpu_extender::ClusterWriter>(
    ext: std::sync::Arc<fgpu_extender::Extender>,
    writer: std::sync::Arc<W>,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(fgpu_extender::http::serve(listener, ext, writer));
    addr
}
