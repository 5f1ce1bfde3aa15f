//! Soak: many claims through the claim cache, prepare, unprepare and the stale-claim sweep
//! in one long-lived plugin, as a node sees them over weeks.
//!
//! Each claim of this node is allocated (the watch feeds the cache), prepared (the cache
//! answers), and after a window of newer claims deleted: every other one the kubelet
//! unprepares first, the rest it never does (the kubelet was down, the pod force-deleted),
//! so only the sweep can remove them. Claims of other nodes pass through the cache too (the
//! watch cannot filter them on the server). After the last claim every record, spec,
//! directory, cache entry and suspect must be gone, and the process's memory must not
//! have grown with the number of claims.
//!
//! `make test` runs a short one; the long one (`FGPU_SOAK_CLAIMS`, default 100,000) is
//! ignored unless asked for, and prints its figures:
//!
//! ```text
//! cargo test -p fgpu-kubelet-plugin --lib soak -- --ignored --nocapture
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::*;
use crate::claim_cache::{CachedClaimSource, ClaimCache};

/// Counts the GETs that reach the "API server" (the map behind the cache).
#[derive(Default)]
struct CountingSource {
    map: MapClaimSource,
    gets: AtomicUsize,
}

impl ClaimSource for CountingSource {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.map.get(namespace, name).await
    }
}

type SoakPlugin = Plugin<CachedClaimSource<Arc<CountingSource>>>;

/// The process's resident and peak resident memory (kB), from /proc/self/status.
fn memory_kb() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn claim(i: usize, pool: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": format!("c{i}"), "namespace": "ns", "uid": format!("u{i}-{pool}")},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.fgpu.dev", "pool": pool,
            "device": format!("gpu-{}", i % 2), "shareID": format!("s{i}"),
            "consumedCapacity": {"memory": "64Mi", "cores": "1"}}]}}}
    }))
    .unwrap()
}

fn claim_ref(c: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        namespace: c.metadata.namespace.clone(),
        name: c.metadata.name.clone(),
        uid: c.metadata.uid.clone(),
    }
}

/// The API server deletes the claim: the map forgets it, the watch tells the cache.
fn delete(source: &CountingSource, cache: &ClaimCache, c: &ClaimRef) {
    source.map.remove(&c.namespace, &c.name);
    cache.deleted(&c.uid);
}

fn count_entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// What a soak measured.
#[derive(Debug)]
struct Figures {
    claims: usize,
    seconds: f64,
    swept: usize,
    unprepared: usize,
    sweeps: usize,
    /// VmRSS (kB) after the first tenth of the claims, and at the end.
    rss_early_kb: u64,
    rss_end_kb: u64,
    peak_kb: u64,
}

/// `total` claims of this node, at most `window` prepared at once, a sweep every
/// `sweep_every` claims.
async fn soak(total: usize, window: usize, sweep_every: usize) -> Figures {
    // On tmpfs where there is one: the soak is about the plugin's memory and bookkeeping,
    // not the disk's fsync latency (which is most of a prepare's time on this VM's disk).
    let env = Env {
        dir: tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap()),
        ..Env::new()
    };
    let source = Arc::new(CountingSource::default());
    let cache = Arc::new(ClaimCache::new("gpu.fgpu.dev", "n1"));
    cache.relist_started();
    cache.relist_done();
    let (plugin, _): (SoakPlugin, _) = Plugin::start(
        env.cfg("b1"),
        CachedClaimSource::new(source.clone(), Some(cache.clone())),
        env.backend.clone(),
    )
    .unwrap();

    let started = Instant::now();
    let mut live = std::collections::VecDeque::new();
    let (mut swept, mut unprepared, mut sweeps) = (0, 0, 0);
    let mut rss_early_kb = 0;
    for i in 0..total {
        // Another node's claim comes and goes through the watch: the cache drops it.
        let other = claim(i, "n2");
        cache.applied(other.clone());
        cache.deleted(&other.metadata.uid);

        let c = claim(i, "n1");
        source.map.insert(c.clone());
        cache.applied(c.clone());
        let devices = plugin.prepare(&claim_ref(&c)).await.unwrap();
        assert_eq!(devices.len(), 1, "claim {i}");
        live.push_back(claim_ref(&c));

        if live.len() > window {
            let old = live.pop_front().unwrap();
            if i % 2 == 0 {
                plugin.unprepare(&old).await.unwrap();
                unprepared += 1;
            }
            delete(&source, &cache, &old);
        }
        if (i + 1) % sweep_every == 0 {
            swept += sweep(&plugin).await;
            sweeps += 1;
            // Bounded by what is live plus what waits for its second sighting.
            assert!(
                plugin.claims().len() <= window + 2 * sweep_every,
                "claim {i}"
            );
            assert!(unpoisoned(&plugin.suspects).len() <= 2 * sweep_every);
            assert!(cache.len() <= window + 1);
        }
        if i + 1 == total / 10 {
            rss_early_kb = memory_kb().0;
        }
    }
    for old in live.drain(..) {
        delete(&source, &cache, &old);
    }
    for _ in 0..2 {
        swept += sweep(&plugin).await;
        sweeps += 1;
    }
    let seconds = started.elapsed().as_secs_f64();

    // Every claim went, one way or the other, and left nothing behind.
    assert_eq!(swept + unprepared, total);
    assert!(plugin.claims().is_empty());
    assert!(unpoisoned(&plugin.suspects).is_empty());
    assert!(cache.is_empty());
    assert_eq!(count_entries(&env.dir.path().join("cdi")), 0);
    assert_eq!(count_entries(&env.dir.path().join("run/claims")), 0);
    assert_eq!(count_entries(&env.dir.path().join("run/checkpoint")), 0);
    // The cache answered every prepare: the only GETs were the sweeps', at most one per
    // record present at each.
    let gets = source.gets.load(Ordering::Relaxed);
    assert!(
        gets <= sweeps * (window + 2 * sweep_every),
        "{gets} GETs for {sweeps} sweeps: prepares were not answered from the cache"
    );
    let (rss_end_kb, peak_kb) = memory_kb();
    Figures {
        claims: total,
        seconds,
        swept,
        unprepared,
        sweeps,
        rss_early_kb,
        rss_end_kb,
        peak_kb,
    }
}

/// One stale-claim sweep; the number of claims it removed.
async fn sweep(plugin: &SoakPlugin) -> usize {
    let report = plugin.cleanup_stale().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.removed.len()
}

#[tokio::test]
async fn a_short_soak_leaves_nothing_behind() {
    let f = soak(300, 32, 8).await;
    assert_eq!(f.unprepared + f.swept, 300);
    assert!(f.unprepared > 0 && f.swept > 0, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long soak (FGPU_SOAK_CLAIMS, default 100,000): run it on purpose"]
async fn soak_many_claims() {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let total = var("FGPU_SOAK_CLAIMS", 100_000);
    let window = var("FGPU_SOAK_WINDOW", 256);
    let f = soak(total, window, 64).await;
    println!(
        "soak: {} claims ({window} prepared at once) in {:.1} s ({:.0}/s): {} unprepared by the kubelet, {} by the sweep \
         ({} sweeps); VmRSS {} kB after a tenth, {} kB at the end, peak {} kB",
        f.claims,
        f.seconds,
        f.claims as f64 / f.seconds,
        f.unprepared,
        f.swept,
        f.sweeps,
        f.rss_early_kb,
        f.rss_end_kb,
        f.peak_kb
    );
    // Memory must not grow with the number of claims: allow 16 MiB of allocator slack
    // between a tenth of the run and its end (a leak of even 200 bytes a claim is 18 MiB).
    assert!(
        f.rss_end_kb <= f.rss_early_kb + 16 * 1024,
        "memory grew from {} kB to {} kB",
        f.rss_early_kb,
        f.rss_end_kb
    );
}
