//! What the shim counts in a claim's accounts, read back for the node's metrics.
//!
//! The shim adds to two counters in the files the plugin created for the claim
//! (`docs/shim-contract.md`, "The accounts"): per GPU, the allocations it refused past the
//! memory limit (`memory.state`) and the wall time launches waited for the core quota's
//! bucket (`core.state`); it also keeps a gauge there, the bytes of the claim's use that
//! are managed memory (research tier). The workload can write those files, so the figures
//! are its own claim's word about itself: shown, never acted on. [`Counters`] turns what is
//! read into counters that only go up, so a forged drop cannot make a series go backwards
//! (the gauge is passed on as read).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// `memory.state`: header, then 16 device entries of 64 bytes.
const MEMORY_DEVICES_OFFSET: usize = 64;
const MEMORY_DEVICE_SIZE: usize = 64;
const MEMORY_REFUSALS: usize = 40;
const MEMORY_MANAGED: usize = 48;
/// `core.state`: header, then 16 entries of 256 bytes.
const CORE_ENTRIES_OFFSET: usize = 64;
const CORE_ENTRY_SIZE: usize = 256;
const CORE_THROTTLED_NS: usize = 224;
/// Entries per file.
const ENTRIES: usize = 16;
/// Both entries have the GPU's UUID at 0..16 and a state u32 at 16 (1 = in use).
const STATE: usize = 16;

/// One GPU's counters as the shim wrote them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Raw {
    /// Allocations refused past the limit.
    pub refusals: u64,
    /// Nanoseconds launches waited for the bucket.
    pub throttled_ns: u64,
    /// Bytes of the claim's use that are managed memory (a gauge).
    pub managed: u64,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// (UUID, counter) of each entry in use of one file's bytes.
fn entries(bytes: &[u8], offset: usize, size: usize, field: usize) -> Vec<(String, u64)> {
    (0..ENTRIES)
        .filter_map(|i| {
            let e = bytes.get(offset + i * size..offset + (i + 1) * size)?;
            let uuid: &[u8; 16] = e[..16].try_into().ok()?;
            (u32_at(e, STATE)? == 1).then(|| {
                Some((
                    fgpu_api::names::contract::gpu_uuid_string(uuid),
                    u64_at(e, field)?,
                ))
            })?
        })
        .collect()
}

/// Reads at most `max` bytes of `path` (a file the workload can write: never trusted to
/// be small, regular or well-formed).
fn read_head(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut buf = Vec::with_capacity(max);
    f.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The counters of the claim whose account files are `memory` and `core`, by GPU UUID.
/// A missing, short or unreadable file gives nothing for its counter.
pub fn read(memory: &Path, core: &Path) -> HashMap<String, Raw> {
    let mut out: HashMap<String, Raw> = HashMap::new();
    if let Ok(b) = read_head(memory, MEMORY_DEVICES_OFFSET + ENTRIES * MEMORY_DEVICE_SIZE) {
        for (uuid, v) in entries(
            &b,
            MEMORY_DEVICES_OFFSET,
            MEMORY_DEVICE_SIZE,
            MEMORY_REFUSALS,
        ) {
            out.entry(uuid).or_default().refusals = v;
        }
        for (uuid, v) in entries(
            &b,
            MEMORY_DEVICES_OFFSET,
            MEMORY_DEVICE_SIZE,
            MEMORY_MANAGED,
        ) {
            out.entry(uuid).or_default().managed = v;
        }
    }
    if let Ok(b) = read_head(core, CORE_ENTRIES_OFFSET + ENTRIES * CORE_ENTRY_SIZE) {
        for (uuid, v) in entries(&b, CORE_ENTRIES_OFFSET, CORE_ENTRY_SIZE, CORE_THROTTLED_NS) {
            out.entry(uuid).or_default().throttled_ns = v;
        }
    }
    out
}

/// Per (claim UID, GPU), the counters so far, raised only by what the shim's figures
/// gained since the last read.
#[derive(Debug, Default)]
pub struct Counters {
    last: HashMap<(String, String), (Raw, Raw)>,
}

impl Counters {
    /// Folds one read of claim `uid`'s counters on `gpu` in; returns the totals so far.
    pub fn update(&mut self, uid: &str, gpu: &str, raw: Raw) -> Raw {
        let (seen, total) = self
            .last
            .entry((uid.to_owned(), gpu.to_owned()))
            .or_insert((Raw::default(), Raw::default()));
        // A value that falls (a forged or re-created file) adds nothing until it passes
        // the last one seen.
        let gain = |now: u64, before: u64| now.saturating_sub(before);
        total.refusals += gain(raw.refusals, seen.refusals);
        total.throttled_ns += gain(raw.throttled_ns, seen.throttled_ns);
        seen.refusals = seen.refusals.max(raw.refusals);
        seen.throttled_ns = seen.throttled_ns.max(raw.throttled_ns);
        total.managed = raw.managed;
        *total
    }

    /// Forgets the claims not in `live` (unprepared).
    pub fn retain(&mut self, live: &std::collections::HashSet<&str>) {
        self.last.retain(|(uid, _), _| live.contains(uid.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid_bytes() -> [u8; 16] {
        let mut u = [0u8; 16];
        for (i, b) in u.iter_mut().enumerate() {
            *b = 0xa0 + i as u8;
        }
        u
    }

    const UUID: &str = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf";

    fn file(offset: usize, size: usize, field: usize, entry: usize, value: u64) -> Vec<u8> {
        let mut b = vec![0u8; offset + 16 * size + 4096];
        let e = offset + entry * size;
        b[e..e + 16].copy_from_slice(&uuid_bytes());
        b[e + STATE..e + STATE + 4].copy_from_slice(&1u32.to_le_bytes());
        b[e + field..e + field + 8].copy_from_slice(&value.to_le_bytes());
        b
    }

    #[test]
    fn reads_the_shims_counters_by_gpu_uuid() {
        let d = tempfile::tempdir().unwrap();
        let (m, c) = (d.path().join("memory.state"), d.path().join("core.state"));
        let mut memory = file(64, 64, 40, 3, 7);
        let managed_at = 64 + 3 * 64 + 48;
        memory[managed_at..managed_at + 8].copy_from_slice(&(1u64 << 30).to_le_bytes());
        std::fs::write(&m, memory).unwrap();
        std::fs::write(&c, file(64, 256, 224, 0, 1_500_000_000)).unwrap();
        let r = read(&m, &c);
        assert_eq!(
            r.get(UUID),
            Some(&Raw {
                refusals: 7,
                throttled_ns: 1_500_000_000,
                managed: 1 << 30,
            }),
            "{r:?}"
        );
        assert_eq!(r.len(), 1, "entries not in use are not read: {r:?}");
    }

    #[test]
    fn missing_short_or_odd_files_give_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (m, c) = (d.path().join("memory.state"), d.path().join("core.state"));
        assert!(read(&m, &c).is_empty());
        std::fs::write(&m, [1u8; 70]).unwrap();
        std::fs::create_dir(&c).unwrap();
        assert!(read(&m, &c).is_empty());
    }

    #[test]
    fn counters_only_go_up() {
        let mut k = Counters::default();
        let r = |refusals, throttled_ns| Raw {
            refusals,
            throttled_ns,
            managed: 0,
        };
        assert_eq!(k.update("u", "G", r(2, 100)), r(2, 100));
        assert_eq!(k.update("u", "G", r(5, 100)), r(5, 100));
        // Forged down to 0, then up to 3: nothing until it passes 5.
        assert_eq!(k.update("u", "G", r(0, 0)), r(5, 100));
        assert_eq!(k.update("u", "G", r(3, 50)), r(5, 100));
        assert_eq!(k.update("u", "G", r(6, 150)), r(6, 150));
        // Managed bytes are a gauge: passed on as read, down as well as up.
        let m = |managed| Raw {
            managed,
            ..r(6, 150)
        };
        assert_eq!(k.update("u", "G", m(9)).managed, 9);
        assert_eq!(k.update("u", "G", m(4)).managed, 4);
        k.retain(&std::collections::HashSet::new());
        assert_eq!(
            k.update("u", "G", r(1, 1)),
            r(1, 1),
            "a claim seen anew starts over"
        );
    }
}
