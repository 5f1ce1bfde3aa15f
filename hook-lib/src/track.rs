//! What this process allocated: pointer or handle → (size, device entry, pool).
//!
//! Sharded by address so that threads rarely meet on one lock; each shard is a short
//! critical section (an insert or a remove), never held across a driver call.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rec {
    pub size: u64,
    /// Index in the account's device table.
    pub dev: usize,
    /// The memory pool it came from (0: not a pool allocation).
    pub pool: u64,
}

/// Multiplicative hash for addresses and handles (already well spread in high bits).
#[derive(Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Shard = Mutex<HashMap<u64, Rec, BuildHasherDefault<AddrHasher>>>;
const SHARDS: usize = 64;

pub struct Tracker {
    shards: Box<[Shard]>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
        }
    }
}

impl Tracker {
    fn shard(&self, key: u64) -> &Shard {
        let h = (key >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    pub fn insert(&self, key: u64, rec: Rec) {
        self.shard(key)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, rec);
    }

    pub fn remove(&self, key: u64) -> Option<Rec> {
        self.shard(key)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove() {
        let t = Tracker::default();
        let r = Rec {
            size: 5,
            dev: 1,
            pool: 0,
        };
        for k in 0..1000u64 {
            t.insert(k << 9, r);
        }
        assert_eq!(t.len(), 1000);
        assert_eq!(t.remove(512), Some(r));
        assert_eq!(t.remove(512), None);
        assert_eq!(t.len(), 999);
    }
}
