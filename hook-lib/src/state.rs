//! The claim's shared account: a memory-mapped file with a versioned header, a device
//! table keyed by GPU UUID, and one slot per process.
//!
//! Layout (little-endian, offsets in bytes; documented in README.md):
//! ```text
//! 0     header (64): magic "FGPUACC1" u64, version u32 (1), header_size u32 (64),
//!       slot_count u32, max_devices u32, slot_size u32, device_size u32,
//!       last_reap_ms u64 (CLOCK_MONOTONIC_COARSE), reserved
//! 64    devices[16] (64 each): uuid [u8;16], state u32 (1 = in use), ordinal u32
//!       (of the first process that registered it), limit u64 (last seen), used u64
//!       (the claim's bytes on this GPU: the authority), reserved
//! 1088  slots[1024] (160 each): state u32 (1 = live), pid u32, start_time u64,
//!       reserved 16 bytes, used[16] u64 (this process's share of devices[i].used)
//! ```
//! Hot path: one CAS loop on `devices[i].used` (never above the limit) plus a
//! `fetch_add` on the own slot. `flock` is taken only to initialise the file, to claim a
//! slot, to register a device and to reap. Liveness: each live process holds a POSIX
//! record lock on byte `LOCK_BASE + slot` of the file; the kernel drops it when the
//! process dies (SIGKILL included) or execs, so a slot whose byte is unlocked belongs to
//! nobody — immune to PID reuse and PID namespaces.

use std::ffi::CString;
use std::path::Path;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::config::MAX_DEVICES;

pub const MAGIC: u64 = u64::from_le_bytes(*b"FGPUACC1");
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 64;
pub const DEVICE_SIZE: usize = 64;
pub const SLOT_SIZE: usize = 160;
pub const SLOT_COUNT: usize = 1024;
pub const DEVICES_OFFSET: usize = HEADER_SIZE;
pub const SLOTS_OFFSET: usize = DEVICES_OFFSET + MAX_DEVICES * DEVICE_SIZE;
pub const FILE_SIZE: usize = SLOTS_OFFSET + SLOT_COUNT * SLOT_SIZE;
/// Byte offset of the liveness lock of slot 0 (past the end of the file).
pub const LOCK_BASE: i64 = 1 << 32;
/// Dead slots are looked for at most this often on the allocation path.
pub const REAP_INTERVAL_MS: u64 = 1000;
const NO_SLOT: usize = usize::MAX;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: u32,
    header_size: u32,
    slot_count: u32,
    max_devices: u32,
    slot_size: u32,
    device_size: u32,
    last_reap_ms: AtomicU64,
    _reserved: [u64; 3],
}

#[repr(C)]
struct DeviceEntry {
    uuid: [u8; 16],
    state: AtomicU32,
    ordinal: u32,
    limit: AtomicU64,
    used: AtomicU64,
    _reserved: [u64; 3],
}

#[repr(C)]
struct Slot {
    state: AtomicU32,
    pid: AtomicU32,
    start_time: AtomicU64,
    _reserved: [u64; 2],
    used: [AtomicU64; MAX_DEVICES],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<DeviceEntry>() == DEVICE_SIZE);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);

/// A process's view of an account (shared file, or private memory as a fallback).
pub struct Account {
    base: *mut u8,
    fd: libc::c_int,
    slot: AtomicUsize,
    /// Serialises this process's threads around `flock` (which is per open file).
    lock: Mutex<()>,
}

// SAFETY: the mapping is only accessed through atomics or under `lock` + flock; the raw
// pointer stays valid for the life of the process (never unmapped).
unsafe impl Send for Account {}
// SAFETY: as above.
unsafe impl Sync for Account {}

/// Why the claim's account file cannot be used (the process is then counted alone).
#[derive(Debug)]
pub enum OpenError {
    /// The path holds a NUL byte.
    NulInPath(std::ffi::NulError),
    /// `open(2)` failed.
    Open(std::io::Error),
    /// A system call on the opened file failed.
    Sys {
        call: &'static str,
        err: std::io::Error,
    },
    /// The file is shorter than an account (its size in bytes).
    TooSmall(libc::off_t),
    /// The header's magic or version is not this shim's.
    BadHeader,
}

impl OpenError {
    /// `call` failed with the current `errno`.
    fn sys(call: &'static str) -> OpenError {
        OpenError::Sys {
            call,
            err: std::io::Error::last_os_error(),
        }
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::NulInPath(e) => write!(f, "{e}"),
            OpenError::Open(e) => write!(f, "{e}"),
            OpenError::Sys { call, err } => write!(f, "{call}: {err}"),
            OpenError::TooSmall(size) => write!(f, "size {size} is not an fgpu account"),
            OpenError::BadHeader => f.write_str("unknown magic or version"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::NulInPath(e) => Some(e),
            OpenError::Open(e) | OpenError::Sys { err: e, .. } => Some(e),
            OpenError::TooSmall(_) | OpenError::BadHeader => None,
        }
    }
}

fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC_COARSE is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn own_start_time() -> u64 {
    // Field 22 of /proc/self/stat (after the parenthesised comm).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            rest.split(' ').nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}

impl Account {
    /// Opens (creating if needed) the shared account at `path`; on any problem, or
    /// with no path, an account private to this process. Never fails.
    pub fn open(path: Option<&Path>) -> Account {
        if let Some(p) = path {
            match Self::open_file(p) {
                Ok(a) => return a,
                Err(e) => crate::debug!(
                    "accounting file {}: {e}; counting this process alone",
                    p.display()
                ),
            }
        }
        Self::private()
    }

    fn private() -> Account {
        // SAFETY: anonymous private mapping of FILE_SIZE bytes, checked below.
        let base = unsafe {
            libc::mmap(
                null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        let base = if base == libc::MAP_FAILED {
            // Last resort: leak a zeroed heap block of the same size.
            Box::leak(vec![0u64; FILE_SIZE / 8].into_boxed_slice()).as_mut_ptr() as *mut u8
        } else {
            base as *mut u8
        };
        let a = Account {
            base,
            fd: -1,
            slot: AtomicUsize::new(NO_SLOT),
            lock: Mutex::new(()),
        };
        a.init_header();
        a
    }

    fn open_file(path: &Path) -> Result<Account, OpenError> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(OpenError::NulInPath)?;
        // SAFETY: c is a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o660 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(OpenError::Open(std::io::Error::last_os_error()));
        }
        let fail = |e: OpenError| {
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            Err(e)
        };
        // SAFETY: fd is valid.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return fail(OpenError::sys("flock"));
        }
        // SAFETY: st is written by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd valid, st writable.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return fail(OpenError::sys("fstat"));
        }
        if st.st_size == 0 {
            // SAFETY: fd valid and writable.
            if unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0 {
                return fail(OpenError::sys("ftruncate"));
            }
        } else if (st.st_size as usize) < FILE_SIZE {
            return fail(OpenError::TooSmall(st.st_size));
        }
        // SAFETY: shared mapping of the first FILE_SIZE bytes of a file that long.
        let base = unsafe {
            libc::mmap(
                null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return fail(OpenError::sys("mmap"));
        }
        let a = Account {
            base: base as *mut u8,
            fd,
            slot: AtomicUsize::new(NO_SLOT),
            lock: Mutex::new(()),
        };
        let ok = a.init_header();
        // SAFETY: fd valid.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        if !ok {
            // SAFETY: unmapping what we mapped; `a` is not used afterwards.
            unsafe { libc::munmap(base, FILE_SIZE) };
            return fail(OpenError::BadHeader);
        }
        Ok(a)
    }

    /// Writes the header of a fresh file; checks that of an existing one.
    /// Caller holds flock (or the mapping is private).
    fn init_header(&self) -> bool {
        let h = self.header();
        match h.magic.load(Ordering::Acquire) {
            0 => {
                // SAFETY: the header is plain memory we own under flock; the magic is
                // published last with Release.
                unsafe {
                    let hp = self.base as *mut Header;
                    (*hp).version = VERSION;
                    (*hp).header_size = HEADER_SIZE as u32;
                    (*hp).slot_count = SLOT_COUNT as u32;
                    (*hp).max_devices = MAX_DEVICES as u32;
                    (*hp).slot_size = SLOT_SIZE as u32;
                    (*hp).device_size = DEVICE_SIZE as u32;
                }
                h.magic.store(MAGIC, Ordering::Release);
                true
            }
            MAGIC => {
                h.version == VERSION
                    && h.slot_count as usize == SLOT_COUNT
                    && h.max_devices as usize == MAX_DEVICES
            }
            _ => false,
        }
    }

    pub fn is_shared(&self) -> bool {
        self.fd >= 0
    }

    fn header(&self) -> &Header {
        // SAFETY: base points to at least FILE_SIZE mapped bytes, suitably aligned (page).
        unsafe { &*(self.base as *const Header) }
    }

    fn device(&self, i: usize) -> &DeviceEntry {
        debug_assert!(i < MAX_DEVICES);
        // SAFETY: i < MAX_DEVICES keeps the entry inside the mapping.
        unsafe { &*(self.base.add(DEVICES_OFFSET + i * DEVICE_SIZE) as *const DeviceEntry) }
    }

    fn slot_at(&self, i: usize) -> &Slot {
        debug_assert!(i < SLOT_COUNT);
        // SAFETY: i < SLOT_COUNT keeps the slot inside the mapping.
        unsafe { &*(self.base.add(SLOTS_OFFSET + i * SLOT_SIZE) as *const Slot) }
    }

    /// Runs `f` holding the in-process lock and the file's flock.
    fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.fd >= 0 {
            // SAFETY: fd valid.
            unsafe { libc::flock(self.fd, libc::LOCK_EX) };
        }
        let r = f();
        if self.fd >= 0 {
            // SAFETY: fd valid.
            unsafe { libc::flock(self.fd, libc::LOCK_UN) };
        }
        r
    }

    fn record_lock(&self, slot: usize, cmd: libc::c_int, kind: libc::c_short) -> libc::flock {
        // SAFETY: zeroed flock is valid.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = LOCK_BASE + slot as i64;
        fl.l_len = 1;
        // SAFETY: fd valid, fl initialised.
        let r = unsafe { libc::fcntl(self.fd, cmd, &mut fl) };
        if r != 0 {
            fl.l_type = -1;
        }
        fl
    }

    /// Does a live process own slot `i`? (Never asked about our own slot.)
    fn slot_alive(&self, i: usize) -> bool {
        if self.fd < 0 {
            return false;
        }
        let fl = self.record_lock(i, libc::F_GETLK, libc::F_WRLCK as libc::c_short);
        // F_UNLCK: nobody holds the byte. An error (-1) counts as alive (keep memory).
        fl.l_type != libc::F_UNLCK as libc::c_short
    }

    /// Returns the memory of dead processes to the claim. Caller holds `exclusive`.
    fn reap_locked(&self) -> usize {
        if self.fd < 0 {
            return 0;
        }
        let own = self.slot.load(Ordering::Relaxed);
        let mut n = 0;
        for i in 0..SLOT_COUNT {
            let s = self.slot_at(i);
            if i == own || s.state.load(Ordering::Acquire) != 1 || self.slot_alive(i) {
                continue;
            }
            for d in 0..MAX_DEVICES {
                let u = s.used[d].swap(0, Ordering::AcqRel);
                if u != 0 {
                    sat_sub(&self.device(d).used, u);
                }
            }
            crate::debug!(
                "reclaimed slot {i} of dead pid {}",
                s.pid.load(Ordering::Relaxed)
            );
            s.state.store(0, Ordering::Release);
            n += 1;
        }
        self.header()
            .last_reap_ms
            .store(monotonic_ms(), Ordering::Relaxed);
        n
    }

    /// Looks for dead processes now.
    pub fn reap(&self) -> usize {
        self.exclusive(|| self.reap_locked())
    }

    fn maybe_reap(&self) {
        if self.fd < 0 {
            return;
        }
        let h = self.header();
        let now = monotonic_ms();
        let last = h.last_reap_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= REAP_INTERVAL_MS
            && h.last_reap_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.reap();
        }
    }

    /// This process's slot, claimed on first use.
    fn own_slot(&self) -> Option<&Slot> {
        let s = self.slot.load(Ordering::Acquire);
        if s != NO_SLOT {
            return Some(self.slot_at(s));
        }
        let s = self.exclusive(|| {
            let s = self.slot.load(Ordering::Acquire);
            if s != NO_SLOT {
                return s;
            }
            if self.fd < 0 {
                self.slot.store(0, Ordering::Release);
                return 0;
            }
            self.reap_locked();
            for i in 0..SLOT_COUNT {
                let slot = self.slot_at(i);
                if slot.state.load(Ordering::Acquire) != 0 {
                    continue;
                }
                let fl = self.record_lock(i, libc::F_SETLK, libc::F_WRLCK as libc::c_short);
                if fl.l_type == -1 {
                    continue;
                }
                for u in &slot.used {
                    u.store(0, Ordering::Relaxed);
                }
                // SAFETY: getpid has no preconditions.
                slot.pid
                    .store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
                slot.start_time.store(own_start_time(), Ordering::Relaxed);
                slot.state.store(1, Ordering::Release);
                self.slot.store(i, Ordering::Release);
                return i;
            }
            NO_SLOT
        });
        (s != NO_SLOT).then(|| self.slot_at(s))
    }

    /// The device table index of the GPU with this UUID, registering it if new.
    pub fn device_index(&self, uuid: &[u8; 16], ordinal: i32) -> Option<usize> {
        if let Some(i) = self.find_device(uuid) {
            return Some(i);
        }
        self.exclusive(|| {
            if let Some(i) = self.find_device(uuid) {
                return Some(i);
            }
            let i =
                (0..MAX_DEVICES).find(|&i| self.device(i).state.load(Ordering::Acquire) == 0)?;
            // SAFETY: a free entry is written only under flock; published by `state`.
            unsafe {
                let e = self.base.add(DEVICES_OFFSET + i * DEVICE_SIZE) as *mut DeviceEntry;
                (*e).uuid = *uuid;
                (*e).ordinal = ordinal as u32;
            }
            self.device(i).state.store(1, Ordering::Release);
            Some(i)
        })
    }

    pub fn find_device(&self, uuid: &[u8; 16]) -> Option<usize> {
        (0..MAX_DEVICES).find(|&i| {
            let e = self.device(i);
            e.state.load(Ordering::Acquire) == 1 && e.uuid == *uuid
        })
    }

    /// Bytes the claim holds on device entry `i`.
    pub fn used(&self, i: usize) -> u64 {
        self.device(i).used.load(Ordering::Acquire)
    }

    /// Bytes this process holds on device entry `i`.
    pub fn own_used(&self, i: usize) -> u64 {
        let s = self.slot.load(Ordering::Acquire);
        if s == NO_SLOT {
            return 0;
        }
        self.slot_at(s).used[i].load(Ordering::Relaxed)
    }

    fn cas_add(&self, i: usize, size: u64, limit: u64) -> bool {
        let used = &self.device(i).used;
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let Some(new) = cur.checked_add(size).filter(|&n| n <= limit) else {
                return false;
            };
            match used.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(x) => cur = x,
            }
        }
    }

    /// Takes `size` bytes of device entry `i` if the claim stays within `limit`.
    pub fn try_reserve(&self, i: usize, size: u64, limit: u64) -> bool {
        let Some(slot) = self.own_slot() else {
            crate::debug!("no free slot in the accounting file; refusing");
            return false;
        };
        self.maybe_reap();
        let dev = self.device(i);
        if dev.limit.load(Ordering::Relaxed) != limit {
            dev.limit.store(limit, Ordering::Relaxed);
        }
        if !self.cas_add(i, size, limit) {
            // Memory of processes that died since the last look may make room.
            if self.reap() == 0 || !self.cas_add(i, size, limit) {
                return false;
            }
        }
        slot.used[i].fetch_add(size, Ordering::Relaxed);
        true
    }

    /// Takes `size` bytes even past the limit (the driver already gave them).
    pub fn force_reserve(&self, i: usize, size: u64) {
        if let Some(slot) = self.own_slot() {
            self.device(i).used.fetch_add(size, Ordering::AcqRel);
            slot.used[i].fetch_add(size, Ordering::Relaxed);
        }
    }

    /// Gives back `size` bytes of device entry `i` (never below zero).
    pub fn release(&self, i: usize, size: u64) {
        let s = self.slot.load(Ordering::Acquire);
        if s == NO_SLOT || size == 0 {
            return;
        }
        sat_sub(&self.slot_at(s).used[i], size);
        sat_sub(&self.device(i).used, size);
    }
}

fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |x| {
        Some(x.saturating_sub(v))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fgpu-state-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    #[test]
    fn layout_constants() {
        assert_eq!(SLOTS_OFFSET, 1088);
        assert_eq!(FILE_SIZE, 1088 + 1024 * 160);
    }

    #[test]
    fn reserve_never_passes_limit_and_release_saturates() {
        let p = tmp("limit");
        let a = Account::open(Some(&p));
        assert!(a.is_shared());
        let d = a.device_index(&[7; 16], 0).unwrap();
        assert!(a.try_reserve(d, 600, 1000));
        assert!(!a.try_reserve(d, 500, 1000));
        assert!(a.try_reserve(d, 400, 1000));
        assert_eq!(a.used(d), 1000);
        a.release(d, 5000);
        assert_eq!(a.used(d), 0);
        // A second view of the same file sees the same device entry.
        let b = Account::open(Some(&p));
        assert_eq!(b.find_device(&[7; 16]), Some(d));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn threads_never_lose_updates() {
        let p = tmp("threads");
        let a = std::sync::Arc::new(Account::open(Some(&p)));
        let d = a.device_index(&[9; 16], 0).unwrap();
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if a.try_reserve(d, 3, 1 << 40) {
                            a.release(d, 3);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(a.used(d), 0);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn bad_file_falls_back_to_private() {
        let p = tmp("bad");
        std::fs::write(&p, b"not an account").unwrap();
        let a = Account::open(Some(&p));
        assert!(!a.is_shared());
        let d = a.device_index(&[1; 16], 0).unwrap();
        assert!(a.try_reserve(d, 10, 10));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn open_file_says_why_it_refuses() {
        let p = tmp("short");
        std::fs::write(&p, b"not an account").unwrap();
        let e = Account::open_file(&p).err().unwrap();
        assert!(matches!(e, OpenError::TooSmall(14)), "{e:?}");
        assert_eq!(e.to_string(), "size 14 is not an fgpu account");

        std::fs::write(&p, vec![0xff; FILE_SIZE]).unwrap();
        let e = Account::open_file(&p).err().unwrap();
        assert!(matches!(e, OpenError::BadHeader), "{e:?}");
        assert_eq!(e.to_string(), "unknown magic or version");
        let _ = std::fs::remove_file(&p);

        let e = Account::open_file(Path::new("/nonexistent-fgpu-dir/account"))
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Open(_)), "{e:?}");
        assert_eq!(e.to_string(), "No such file or directory (os error 2)");

        let e = Account::open_file(Path::new("a\0b")).err().unwrap();
        assert!(matches!(e, OpenError::NulInPath(_)), "{e:?}");
    }
}
