//! Makes the kubelet's plugin-registration client acceptable to tonic's HTTP/2 server.
//!
//! The kubelet dials the registration socket with grpc-go and a bare path as the target
//! (`pkg/kubelet/pluginmanager/operationexecutor`, no `WithAuthority`), so every request
//! carries `:authority: %2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F<driver>-reg.sock`. The
//! `h2` crate checks `:authority` strictly and resets such a stream with `PROTOCOL_ERROR`
//! (hyperium/h2#487, kubernetes/kubernetes#109081; the kubelet fixed its device-plugin and
//! CSI clients in kubernetes/kubernetes#112597, not this one). Neither tonic nor h2 can be told
//! to accept it, so each accepted connection is relayed through [`serve_connection`], which
//! rewrites the `:authority` value of incoming HEADERS frames to `localhost` (what the
//! kubelet's other unix-socket clients send) and copies everything else byte for byte.
//!
//! HPACK stays consistent without decoding Huffman strings: the field keeps its
//! representation (a literal with the static `:authority` name, incremental indexing or not)
//! and only its value changes; the rewrite is done only when the new value is provably not
//! longer than the old one, so the server's dynamic table entry is never bigger than the
//! client's, the server never evicts an entry the client still refers to, and every index
//! the client sends means the same header on both sides.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The value put in place of the kubelet's `:authority`.
pub const AUTHORITY: &[u8] = b"localhost";

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// HPACK static table index of `:authority`.
const STATIC_AUTHORITY: u64 = 1;

/// Reads an HPACK integer with an N-bit prefix at `pos`; returns it and the next position.
fn read_int(buf: &[u8], pos: usize, prefix_bits: u32) -> Option<(u64, usize)> {
    let max = (1u64 << prefix_bits) - 1;
    let mut value = u64::from(*buf.get(pos)?) & max;
    let mut pos = pos + 1;
    if value < max {
        return Some((value, pos));
    }
    let mut shift = 0u32;
    loop {
        let b = *buf.get(pos)?;
        pos += 1;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, pos));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// An HPACK string at `pos`: (Huffman-coded, encoded length, start of the bytes, end).
fn read_string(buf: &[u8], pos: usize) -> Option<(bool, usize, usize)> {
    let huffman = *buf.get(pos)? & 0x80 != 0;
    let (len, start) = read_int(buf, pos, 7)?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    (end <= buf.len()).then_some((huffman, start, end))
}

/// Whether the value's decoded length is at least [`AUTHORITY`]'s: known for a raw string;
/// for a Huffman string at least `8 * bytes / 30` (the longest code is 30 bits).
fn long_enough(huffman: bool, encoded_len: usize) -> bool {
    let decoded_min = if huffman {
        encoded_len * 8 / 30
    } else {
        encoded_len
    };
    decoded_min >= AUTHORITY.len()
}

/// Rewrites the `:authority` literals of an HPACK header block to [`AUTHORITY`]. `None`
/// when nothing was rewritten or the block cannot be parsed (it is then passed on as is, and
/// h2 answers it as it would have).
pub fn rewrite_header_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut pos = 0;
    let mut changed = false;
    while pos < block.len() {
        let b = block[pos];
        let prefix = if b & 0x80 != 0 {
            // Indexed field.
            let (_, next) = read_int(block, pos, 7)?;
            out.extend_from_slice(&block[pos..next]);
            pos = next;
            continue;
        } else if b & 0xc0 == 0x40 {
            6 // literal with incremental indexing
        } else if b & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, next) = read_int(block, pos, 5)?;
            out.extend_from_slice(&block[pos..next]);
            pos = next;
            continue;
        } else {
            4 // literal without indexing / never indexed
        };
        let (index, mut value_at) = read_int(block, pos, prefix)?;
        if index == 0 {
            value_at = read_string(block, value_at)?.2;
        }
        let (huffman, start, end) = read_string(block, value_at)?;
        if index == STATIC_AUTHORITY && long_enough(huffman, end - start) {
            out.extend_from_slice(&block[pos..value_at]);
            out.push(AUTHORITY.len() as u8); // raw string, length < 127
            out.extend_from_slice(AUTHORITY);
            changed = true;
        } else {
            out.extend_from_slice(&block[pos..end]);
        }
        pos = end;
    }
    changed.then_some(out)
}

/// Rewrites a HEADERS frame's payload (padding and priority kept). `None`: unchanged.
fn rewrite_headers_payload(flags: u8, payload: &[u8]) -> Option<Vec<u8>> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & FLAG_PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    if start > end {
        return None;
    }
    let block = rewrite_header_block(&payload[start..end])?;
    let mut out = Vec::with_capacity(payload.len());
    out.extend_from_slice(&payload[..start]);
    out.extend_from_slice(&block);
    out.extend_from_slice(&payload[end..]);
    Some(out)
}

/// Copies an HTTP/2 client's bytes from `from` to `to`, rewriting `:authority` in HEADERS
/// frames that carry a whole header block. Anything that is not HTTP/2 is copied unchanged.
pub async fn relay_client_to_server<R, W>(mut from: R, mut to: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    let mut got = 0;
    while got < preface.len() {
        let n = from.read(&mut preface[got..]).await?;
        if n == 0 {
            to.write_all(&preface[..got]).await?;
            return to.shutdown().await;
        }
        got += n;
    }
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        tokio::io::copy(&mut from, &mut to).await?;
        return to.shutdown().await;
    }
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        if head[3] == FRAME_HEADERS
            && head[4] & FLAG_END_HEADERS != 0
            && let Some(new) = rewrite_headers_payload(head[4], &payload)
            && new.len() < 1 << 24
        {
            let n = new.len();
            head[0] = (n >> 16) as u8;
            head[1] = (n >> 8) as u8;
            head[2] = n as u8;
            payload = new;
        }
        to.write_all(&head).await?;
        to.write_all(&payload).await?;
        to.flush().await?;
    }
    to.shutdown().await
}

/// Relays one accepted connection: returns the stream to hand to the gRPC server, and
/// spawns the two copying tasks (client → server through [`relay_client_to_server`],
/// server → client unchanged).
pub fn serve_connection<S>(client: S) -> tokio::io::DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (server_side, relay_side) = tokio::io::duplex(64 * 1024);
    let (client_read, mut client_write) = tokio::io::split(client);
    let (mut relay_read, relay_write) = tokio::io::split(relay_side);
    tokio::spawn(async move {
        let up = relay_client_to_server(client_read, relay_write);
        let down = async {
            tokio::io::copy(&mut relay_read, &mut client_write).await?;
            client_write.shutdown().await
        };
        let (a, b) = tokio::join!(up, down);
        if let Err(e) = a.and(b) {
            tracing::debug!(error = %e, "registration connection ended");
        }
    });
    server_side
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `:authority` as grpc-go sends it for a bare socket path: literal with incremental
    /// indexing, static name 1, raw value here (Huffman in practice; same lengths logic).
    fn literal(index_prefix: u8, value: &[u8]) -> Vec<u8> {
        let mut v = vec![index_prefix];
        assert!(value.len() < 127);
        v.push(value.len() as u8);
        v.extend_from_slice(value);
        v
    }

    #[test]
    fn authority_literals_are_rewritten_other_fields_kept() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.fgpu.dev-reg.sock";
        // :method POST (indexed 3), :scheme http (indexed 6), :path literal (idx 4),
        // :authority literal with incremental indexing (0x40 | 1), te literal with a name.
        let mut block = vec![0x83, 0x86];
        block.extend(literal(0x44, b"/pluginregistration.Registration/GetInfo"));
        block.extend(literal(0x41, path));
        block.extend([0x40, 2, b't', b'e', 8]);
        block.extend_from_slice(b"trailers");
        let out = rewrite_header_block(&block).unwrap();
        let mut want = vec![0x83, 0x86];
        want.extend(literal(0x44, b"/pluginregistration.Registration/GetInfo"));
        want.extend(literal(0x41, b"localhost"));
        want.extend([0x40, 2, b't', b'e', 8]);
        want.extend_from_slice(b"trailers");
        assert_eq!(out, want);

        // Without indexing (0x01) and never indexed (0x11) are rewritten the same way.
        assert_eq!(
            rewrite_header_block(&literal(0x01, path)).unwrap(),
            literal(0x01, b"localhost")
        );
        assert_eq!(
            rewrite_header_block(&literal(0x11, path)).unwrap(),
            literal(0x11, b"localhost")
        );
        // A second request refers to the dynamic entry by index: nothing to do.
        assert_eq!(rewrite_header_block(&[0x83, 0x86, 0xbe]), None);
        // A short value (maybe shorter than "localhost") is left alone; so is a Huffman
        // string too short to be sure.
        assert_eq!(rewrite_header_block(&literal(0x41, b"a.b")), None);
        assert_eq!(rewrite_header_block(&[0x41, 0x80 | 20]), None); // truncated: None
        let mut short_huffman = vec![0x41, 0x80 | 20];
        short_huffman.extend([0u8; 20]);
        assert_eq!(rewrite_header_block(&short_huffman), None);
        let mut long_huffman = vec![0x41, 0x80 | 40];
        long_huffman.extend([0u8; 40]);
        assert_eq!(
            rewrite_header_block(&long_huffman).unwrap(),
            literal(0x41, b"localhost")
        );
        // A table size update and a multi-byte integer are skipped correctly.
        let mut b = vec![0x3f, 0xe1, 0x1f]; // size update 4096
        b.extend(literal(0x41, path));
        let mut w = vec![0x3f, 0xe1, 0x1f];
        w.extend(literal(0x41, b"localhost"));
        assert_eq!(rewrite_header_block(&b).unwrap(), w);
    }

    #[test]
    fn headers_payload_keeps_padding_and_priority() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock";
        let mut payload = vec![3]; // pad length
        payload.extend([0, 0, 0, 0, 16]); // priority
        payload.extend(literal(0x41, path));
        payload.extend([0, 0, 0]);
        let out = rewrite_headers_payload(FLAG_PADDED | FLAG_PRIORITY, &payload).unwrap();
        let mut want = vec![3, 0, 0, 0, 0, 16];
        want.extend(literal(0x41, b"localhost"));
        want.extend([0, 0, 0]);
        assert_eq!(out, want);
    }

    #[tokio::test]
    async fn relay_rewrites_headers_frames_only() {
        let path = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock";
        let block = literal(0x41, path);
        let mut input = PREFACE.to_vec();
        // SETTINGS (type 4), empty.
        input.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        // HEADERS, END_HEADERS, stream 1.
        input.extend([0, 0, block.len() as u8, 1, 4, 0, 0, 0, 1]);
        input.extend(&block);
        // DATA with the same bytes: untouched.
        input.extend([0, 0, block.len() as u8, 0, 1, 0, 0, 0, 1]);
        input.extend(&block);
        let mut out = Vec::new();
        relay_client_to_server(&input[..], &mut out).await.unwrap();
        let new_block = literal(0x41, b"localhost");
        let mut want = PREFACE.to_vec();
        want.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        want.extend([0, 0, new_block.len() as u8, 1, 4, 0, 0, 0, 1]);
        want.extend(&new_block);
        want.extend([0, 0, block.len() as u8, 0, 1, 0, 0, 0, 1]);
        want.extend(&block);
        assert_eq!(out, want);

        // Not HTTP/2: copied as is.
        let mut out = Vec::new();
        relay_client_to_server(&b"hello, not a preface at all"[..], &mut out)
            .await
            .unwrap();
        assert_eq!(out, b"hello, not a preface at all");
    }
}
