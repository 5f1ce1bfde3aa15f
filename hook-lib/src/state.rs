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
//!       (the claim's bytes on this GPU: the authority), refusals u64, managed u64 (the
//!       part of `used` served by managed memory: the research tier's spill), reserved
//! 1088  slots[1024] (160 each): state u32 (1 = live), pid u32, start_time u64,
//!       reserved 16 bytes, used[16] u64 (this process's share of devices[i].used)
//! ```
//! Hot path: one CAS loop on `devices[i].used` (never above the limit) plus a
//! `fetch_add` on the own slot. `flock` is taken only to initialise the file, to claim a
//! slot, to register a device and to reap. Liveness: each live process holds a POSIX
//! **open-file-description** record lock (`F_OFD_SETLK`) on byte `LOCK_BASE + slot` of
//! the file. Such a lock belongs to the open file, which the shared mapping keeps open:
//! it survives a program closing descriptors it did not open (`close`, `closefrom`,
//! `close_range`, `dup2` onto ours) and is dropped only when the process dies (SIGKILL
//! included) or execs. The mapping is `MADV_DONTFORK` and a forked child closes the
//! inherited descriptor, so a child never keeps its parent's slot alive. A slot whose
//! byte is unlocked belongs to nobody — immune to PID reuse and PID namespaces.
//!
//! No private fallback: an account that is configured but cannot be used refuses every
//! allocation it would book (one line on stderr says why). Claim mode opens the
//! plugin's files `O_RDWR | O_NOFOLLOW`, never creating one, and checks type, size and
//! header; env mode creates `$FGPU_STATE_DIR/fgpu-memory.state`. An [`Account`] is one
//! part per claim; device indices carry the part (`part * MAX_DEVICES + entry`).

use std::ffi::CString;
use std::path::Path;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

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
    /// Allocations refused past the limit (informational: the node's metrics read it; a
    /// tenant can write it, nothing enforces by it).
    refusals: AtomicU64,
    /// The part of `used` that is managed memory (research tier). The metrics read it; the
    /// choice between device and managed memory reads it too, but the grant (`used`
    /// against the limit) is what holds the quota, so a tenant who writes it moves bytes
    /// between device and host memory, never past the grant.
    managed: AtomicU64,
    _reserved: [u64; 1],
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
// The fields the node's plugin reads back (docs/shim-contract.md, "The accounts").
const _: () = assert!(std::mem::offset_of!(DeviceEntry, state) == 16);
const _: () = assert!(std::mem::offset_of!(DeviceEntry, refusals) == 40);
const _: () = assert!(std::mem::offset_of!(DeviceEntry, managed) == 48);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);

/// One account file (or private memory when none is configured, or nothing when it is
/// unusable: `broken`).
struct Part {
    base: *mut u8,
    /// The descriptor, checked against (`dev`, `ino`) before use: the program may have
    /// closed it or put another file at its number.
    fd: AtomicI32,
    dev_ino: (u64, u64),
    path: Option<CString>,
    slot: AtomicUsize,
    /// Serialises this process's threads around `flock` (which is per open file).
    lock: Mutex<()>,
    /// Why this account refuses everything (`None`: usable).
    broken: Option<String>,
}

// SAFETY: the mapping is only accessed through atomics or under `lock` + flock; the raw
// pointer stays valid for the life of the process (never unmapped).
unsafe impl Send for Part {}
// SAFETY: as above.
unsafe impl Sync for Part {}

/// A process's view of its accounts: one part per claim, plus a last part that refuses
/// everything (the GPUs no claim owns).
pub struct Account {
    parts: Vec<Part>,
    route: Route,
}

/// Which part (claim) owns a GPU.
type Route = Box<dyn Fn(&[u8; 16]) -> Option<usize> + Send + Sync>;

/// Descriptors of this process's account files, closed in a forked child (a child
/// must not keep its parent's liveness locks).
static FORK_FDS: [AtomicI32; 8] = [const { AtomicI32::new(-1) }; 8];

extern "C" fn close_inherited() {
    for f in &FORK_FDS {
        let fd = f.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: close is async-signal-safe; the descriptor is the parent's copy.
            unsafe { libc::close(fd) };
        }
    }
}

fn remember_fd(fd: libc::c_int) {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registering a handler that only closes descriptors.
        unsafe { libc::pthread_atfork(None, None, Some(close_inherited)) };
    });
    for f in &FORK_FDS {
        if f.compare_exchange(-1, fd, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

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
    /// Claim mode: the plugin's file is not exactly an account's size.
    WrongSize(libc::off_t),
    /// Not a regular file.
    NotRegular,
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
            OpenError::WrongSize(size) => {
                write!(
                    f,
                    "size {size}, expected exactly {FILE_SIZE} (state::FILE_SIZE)"
                )
            }
            OpenError::NotRegular => f.write_str("not a regular file"),
            OpenError::BadHeader => f.write_str("unknown magic or version"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::NulInPath(e) => Some(e),
            OpenError::Open(e) | OpenError::Sys { err: e, .. } => Some(e),
            OpenError::TooSmall(_)
            | OpenError::WrongSize(_)
            | OpenError::NotRegular
            | OpenError::BadHeader => None,
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
    /// Env mode: the shared account at `path`, created if needed; with no path, an
    /// account private to this process. A path that cannot be used refuses every
    /// allocation (never a private fallback).
    pub fn open(path: Option<&Path>) -> Account {
        let part = match path {
            Some(p) => Part::open_or_broken(p, true),
            None => Part::private(None),
        };
        Account {
            parts: vec![part, Part::refusing()],
            route: Box::new(|_| Some(0)),
        }
    }

    /// Claim mode: one part per claim's `memory_account` (never created); `route` says
    /// which claim owns a GPU (`None`: none does, its allocations are refused).
    pub fn open_claims(
        paths: &[&Path],
        route: impl Fn(&[u8; 16]) -> Option<usize> + Send + Sync + 'static,
    ) -> Account {
        let mut parts: Vec<Part> = paths
            .iter()
            .map(|p| Part::open_or_broken(p, false))
            .collect();
        parts.push(Part::refusing());
        Account {
            parts,
            route: Box::new(route),
        }
    }

    /// Whether every configured account is a shared file in use.
    pub fn is_shared(&self) -> bool {
        self.parts[..self.parts.len() - 1]
            .iter()
            .all(|p| p.fd.load(Ordering::Relaxed) >= 0)
    }

    #[inline]
    fn split(&self, i: usize) -> (&Part, usize) {
        let (p, l) = (i / MAX_DEVICES, i % MAX_DEVICES);
        (&self.parts[p.min(self.parts.len() - 1)], l)
    }

    fn part_of(&self, uuid: &[u8; 16]) -> usize {
        (self.route)(uuid)
            .filter(|&p| p < self.parts.len() - 1)
            .unwrap_or(self.parts.len() - 1)
    }

    /// The device index of the GPU with this UUID, registering it if new.
    pub fn device_index(&self, uuid: &[u8; 16], ordinal: i32) -> Option<usize> {
        let p = self.part_of(uuid);
        Some(p * MAX_DEVICES + self.parts[p].device_index(uuid, ordinal)?)
    }

    pub fn find_device(&self, uuid: &[u8; 16]) -> Option<usize> {
        let p = self.part_of(uuid);
        Some(p * MAX_DEVICES + self.parts[p].find_device(uuid)?)
    }

    /// Bytes the claim holds on device `i`.
    pub fn used(&self, i: usize) -> u64 {
        let (p, l) = self.split(i);
        p.used(l)
    }

    /// Bytes this process holds on device `i`.
    pub fn own_used(&self, i: usize) -> u64 {
        let (p, l) = self.split(i);
        p.own_used(l)
    }

    /// Takes `size` bytes of device `i` if the claim stays within `limit`.
    #[inline]
    pub fn try_reserve(&self, i: usize, size: u64, limit: u64) -> bool {
        let (p, l) = self.split(i);
        p.try_reserve(l, size, limit)
    }

    /// Takes `size` bytes even past the limit (the driver already gave them).
    pub fn force_reserve(&self, i: usize, size: u64) {
        let (p, l) = self.split(i);
        p.force_reserve(l, size)
    }

    /// Counts one allocation of device `i` refused past its limit.
    pub fn count_refusal(&self, i: usize) {
        let (p, l) = self.split(i);
        p.count_refusal(l)
    }

    /// Gives back `size` bytes of device `i` (never below zero).
    #[inline]
    pub fn release(&self, i: usize, size: u64) {
        let (p, l) = self.split(i);
        p.release(l, size)
    }

    /// Bytes of device `i`'s use that are managed memory.
    pub fn managed(&self, i: usize) -> u64 {
        let (p, l) = self.split(i);
        p.device(l).managed.load(Ordering::Acquire)
    }

    /// Notes `size` bytes of device `i`'s use as managed memory (`add`) or no longer
    /// (`!add`, never below zero).
    pub fn note_managed(&self, i: usize, size: u64, add: bool) {
        let (p, l) = self.split(i);
        if p.broken.is_some() {
            return;
        }
        let m = &p.device(l).managed;
        if add {
            m.fetch_add(size, Ordering::AcqRel);
        } else {
            sat_sub(m, size);
        }
    }

    /// Looks for dead processes now, in every part.
    pub fn reap(&self) -> usize {
        self.parts.iter().map(Part::reap).sum()
    }
}

impl Part {
    fn open_or_broken(path: &Path, create: bool) -> Part {
        match Self::open_file(path, create) {
            Ok(p) => p,
            Err(e) => {
                let why = format!("account {}: {e}", path.display());
                crate::log::always(format_args!("refusing device allocations: {why}"));
                Self::private(Some(why))
            }
        }
    }

    /// The part for GPUs no claim owns.
    fn refusing() -> Part {
        Self::private(Some("no claim owns this GPU".into()))
    }

    fn private(broken: Option<String>) -> Part {
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
        let a = Part {
            base,
            fd: AtomicI32::new(-1),
            dev_ino: (0, 0),
            path: None,
            slot: AtomicUsize::new(NO_SLOT),
            lock: Mutex::new(()),
            broken,
        };
        a.init_header();
        a
    }

    /// Opens an account file: `create` (env mode) creates it; claim mode requires the
    /// plugin's file, exactly [`FILE_SIZE`] long.
    fn open_file(path: &Path, create: bool) -> Result<Part, OpenError> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(OpenError::NulInPath)?;
        let flags = libc::O_RDWR
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC
            | if create { libc::O_CREAT } else { 0 };
        // SAFETY: c is a valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o660 as libc::c_uint) };
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
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return fail(OpenError::NotRegular);
        }
        if !create && st.st_size as usize != FILE_SIZE {
            return fail(OpenError::WrongSize(st.st_size));
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
        // SAFETY: advising our own mapping: a forked child does not inherit it (nor,
        // with the descriptor closed at fork, the open file that holds our lock).
        unsafe { libc::madvise(base, FILE_SIZE, libc::MADV_DONTFORK) };
        let a = Part {
            base: base as *mut u8,
            fd: AtomicI32::new(fd),
            dev_ino: (st.st_dev, st.st_ino),
            path: Some(c),
            slot: AtomicUsize::new(NO_SLOT),
            lock: Mutex::new(()),
            broken: None,
        };
        let ok = a.init_header();
        // SAFETY: fd valid.
        unsafe { libc::flock(fd, libc::LOCK_UN) };
        if !ok {
            // SAFETY: unmapping what we mapped; `a` is not used afterwards.
            unsafe { libc::munmap(base, FILE_SIZE) };
            return fail(OpenError::BadHeader);
        }
        remember_fd(fd);
        Ok(a)
    }

    /// The account's descriptor if it still refers to the account file; re-opened
    /// (same file, checked) if the program closed it or reused its number; `None` if
    /// neither works (then nothing is reaped: every slot counts as alive).
    fn fd(&self) -> Option<libc::c_int> {
        let fd = self.fd.load(Ordering::Relaxed);
        if fd < 0 {
            return None;
        }
        let same = |fd: libc::c_int| {
            // SAFETY: st is written by fstat; a stale fd just fails.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            (unsafe { libc::fstat(fd, &mut st) } == 0) && (st.st_dev, st.st_ino) == self.dev_ino
        };
        if same(fd) {
            return Some(fd);
        }
        let path = self.path.as_ref()?;
        // SAFETY: a valid C string; never created.
        let nfd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if nfd < 0 {
            return None;
        }
        if !same(nfd) {
            // SAFETY: our descriptor.
            unsafe { libc::close(nfd) };
            return None;
        }
        crate::debug!("account descriptor {fd} was closed or replaced; re-opened as {nfd}");
        self.fd.store(nfd, Ordering::Relaxed);
        remember_fd(nfd);
        Some(nfd)
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
        let fd = self.fd();
        if let Some(fd) = fd {
            // SAFETY: fd checked to be the account file.
            unsafe { libc::flock(fd, libc::LOCK_EX) };
        }
        let r = f();
        if let Some(fd) = fd {
            // SAFETY: as above.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
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
        fl.l_pid = 0; // required for OFD locks
        let Some(fd) = self.fd() else {
            fl.l_type = -1;
            return fl;
        };
        // SAFETY: fd checked to be the account file, fl initialised.
        let r = unsafe { libc::fcntl(fd, cmd, &mut fl) };
        if r != 0 {
            fl.l_type = -1;
        }
        fl
    }

    /// Does a live process own slot `i`? (Never asked about our own slot.)
    fn slot_alive(&self, i: usize) -> bool {
        if self.fd.load(Ordering::Relaxed) < 0 {
            return false;
        }
        let fl = self.record_lock(i, libc::F_OFD_GETLK, libc::F_WRLCK as libc::c_short);
        // F_UNLCK: nobody holds the byte. An error (-1) counts as alive (keep memory).
        fl.l_type != libc::F_UNLCK as libc::c_short
    }

    /// Returns the memory of dead processes to the claim. Caller holds `exclusive`.
    fn reap_locked(&self) -> usize {
        if self.fd.load(Ordering::Relaxed) < 0 {
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
                    let e = self.device(d);
                    sat_sub(&e.used, u);
                    // A slot does not say how much of its use was managed: the managed
                    // part is at most what is left in use.
                    let left = e.used.load(Ordering::Acquire);
                    e.managed.fetch_min(left, Ordering::AcqRel);
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
        if self.fd.load(Ordering::Relaxed) < 0 {
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
            if self.fd.load(Ordering::Relaxed) < 0 {
                self.slot.store(0, Ordering::Release);
                return 0;
            }
            self.reap_locked();
            for i in 0..SLOT_COUNT {
                let slot = self.slot_at(i);
                if slot.state.load(Ordering::Acquire) != 0 {
                    continue;
                }
                let fl = self.record_lock(i, libc::F_OFD_SETLK, libc::F_WRLCK as libc::c_short);
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
        if self.broken.is_some() {
            crate::debug!("refused: {}", self.broken.as_deref().unwrap_or(""));
            return false;
        }
        let Some(slot) = self.own_slot() else {
            say_no_slot();
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

    /// Counts one refusal on device entry `i`.
    pub fn count_refusal(&self, i: usize) {
        if self.broken.is_none() {
            self.device(i).refusals.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Takes `size` bytes even past the limit (the driver already gave them).
    pub fn force_reserve(&self, i: usize, size: u64) {
        if self.broken.is_some() {
            return;
        }
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

/// Fuzzing only (`fuzz/`, `tests/fuzz-targets`): opens the claim-mode account file at
/// `path` as the shim does, books and gives back memory on one GPU, reaps, then unmaps and
/// closes it (the shim never does: its account lives as long as the process). `Err` says
/// why the file was refused; `Ok` is the device index used, if any.
#[doc(hidden)]
pub fn fuzz_account_file(path: &Path, uuid: &[u8; 16]) -> Result<Option<usize>, String> {
    let part = Part::open_file(path, false).map_err(|e| e.to_string())?;
    let index = part.device_index(uuid, 0);
    if let Some(i) = index {
        if part.try_reserve(i, 1 << 20, 1 << 30) {
            part.release(i, 1 << 20);
        } else {
            part.count_refusal(i);
        }
        part.force_reserve(i, 1);
        let _ = (part.used(i), part.own_used(i));
    }
    part.reap();
    part.close();
    Ok(index)
}

impl Part {
    /// Unmaps a file-backed part and closes its descriptor (fuzzing only, see
    /// [`fuzz_account_file`]).
    fn close(self) {
        let fd = self.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            for f in &FORK_FDS {
                let _ = f.compare_exchange(fd, -1, Ordering::Relaxed, Ordering::Relaxed);
            }
            // SAFETY: our descriptor; nothing uses it after this.
            unsafe { libc::close(fd) };
        }
        // SAFETY: a file-backed part maps FILE_SIZE bytes at base; `self` is consumed.
        unsafe { libc::munmap(self.base as *mut libc::c_void, FILE_SIZE) };
    }
}

fn sat_sub(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |x| {
        Some(x.saturating_sub(v))
    });
}

/// Says once per process, whatever `FGPU_LOG` says, why its device allocations are refused
/// when every process slot of the claim's account is held by a live process.
#[cold]
fn say_no_slot() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let said = crate::log::always_once(
        &SAID,
        format_args!(
            "refusing device allocations: all {SLOT_COUNT} process slots of the claim's account \
             are held by live processes (the most one claim may have at once); this process \
             gets none until one of them exits"
        ),
    );
    if !said {
        crate::debug!("no free slot in the accounting file; refusing");
    }
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
    fn the_fuzzing_entry_checks_the_file_and_writes_through_it() {
        let p = tmp("fuzz-entry");
        std::fs::write(&p, b"short").unwrap();
        let e = fuzz_account_file(&p, &[7; 16]).unwrap_err();
        assert!(e.contains("size"), "{e}");
        std::fs::write(&p, vec![0u8; FILE_SIZE]).unwrap();
        for _ in 0..3 {
            assert_eq!(fuzz_account_file(&p, &[7; 16]), Ok(Some(0)));
        }
        // What it did went to the file: the GPU registered in entry 0.
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[DEVICES_OFFSET..DEVICES_OFFSET + 16], &[7; 16]);
        assert_eq!(bytes[DEVICES_OFFSET + 16], 1);
        let _ = std::fs::remove_file(&p);
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
    fn a_claim_with_every_slot_held_refuses_until_a_holder_dies() {
        use std::os::unix::fs::FileExt as _;
        use std::os::unix::io::AsRawFd as _;
        let p = tmp("full");
        // The plugin creates the file; a first account initialises the header.
        drop(Account::open(Some(&p)));
        // 1,024 live processes: every slot marked in use, and every slot's liveness byte
        // locked by another open file description (as each process's own would be).
        let holders = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        for i in 0..SLOT_COUNT {
            holders
                .write_all_at(&1u32.to_le_bytes(), (SLOTS_OFFSET + i * SLOT_SIZE) as u64)
                .unwrap();
        }
        // SAFETY: zeroed flock is valid.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = LOCK_BASE;
        fl.l_len = SLOT_COUNT as i64;
        // SAFETY: a valid descriptor and an initialised flock.
        let r = unsafe { libc::fcntl(holders.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());

        let a = Account::open(Some(&p));
        let d = a.device_index(&[5; 16], 0).unwrap();
        assert!(
            !a.try_reserve(d, 10, 1 << 30),
            "a 1,025th process got memory"
        );
        assert!(!a.try_reserve(d, 10, 1 << 30));
        assert_eq!(a.used(d), 0);

        // One holder dies (its byte unlocked): its slot is reaped and taken.
        fl.l_type = libc::F_UNLCK as libc::c_short;
        fl.l_start = LOCK_BASE + 7;
        fl.l_len = 1;
        // SAFETY: as above.
        let r = unsafe { libc::fcntl(holders.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        assert!(a.try_reserve(d, 10, 1 << 30));
        assert_eq!(a.used(d), 10);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn an_unusable_file_refuses_instead_of_counting_alone() {
        let p = tmp("bad");
        std::fs::write(&p, b"not an account").unwrap();
        let a = Account::open(Some(&p));
        assert!(!a.is_shared());
        let d = a.device_index(&[1; 16], 0).unwrap();
        assert!(!a.try_reserve(d, 10, 1 << 30));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn claim_mode_never_creates_and_checks_type_and_size() {
        let p = tmp("claim");
        let e = Part::open_file(&p, false).err().unwrap();
        assert!(matches!(e, OpenError::Open(_)), "{e:?}");
        assert!(!p.exists(), "claim mode created the account");
        std::fs::write(&p, vec![0u8; FILE_SIZE - 8]).unwrap();
        let e = Part::open_file(&p, false).err().unwrap();
        assert!(matches!(e, OpenError::WrongSize(_)), "{e:?}");
        std::fs::write(&p, vec![0u8; FILE_SIZE]).unwrap();
        assert!(Part::open_file(&p, false).is_ok());
        let l = tmp("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(Part::open_file(&l, false).is_err(), "followed a symlink");
        let _ = std::fs::remove_file(&l);
        let d = tmp("dir");
        std::fs::create_dir_all(&d).unwrap();
        assert!(Part::open_file(&d, false).is_err());
        let _ = std::fs::remove_dir(&d);
        // Two claims: devices route to their claim's part; an unowned GPU is refused.
        let q = tmp("claim2");
        std::fs::write(&q, vec![0u8; FILE_SIZE]).unwrap();
        let a = Account::open_claims(&[&p, &q], |u| match u[0] {
            1 => Some(0),
            2 => Some(1),
            _ => None,
        });
        let d1 = a.device_index(&[1; 16], 0).unwrap();
        let d2 = a.device_index(&[2; 16], 1).unwrap();
        let d3 = a.device_index(&[3; 16], 2).unwrap();
        assert!(a.try_reserve(d1, 10, 100) && a.try_reserve(d2, 20, 100));
        assert!(!a.try_reserve(d3, 1, 100));
        assert_eq!((a.used(d1), a.used(d2)), (10, 20));
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(&q);
    }

    #[test]
    fn open_file_says_why_it_refuses() {
        let p = tmp("short");
        std::fs::write(&p, b"not an account").unwrap();
        let e = Part::open_file(&p, true).err().unwrap();
        assert!(matches!(e, OpenError::TooSmall(14)), "{e:?}");
        assert_eq!(e.to_string(), "size 14 is not an fgpu account");

        std::fs::write(&p, vec![0xff; FILE_SIZE]).unwrap();
        let e = Part::open_file(&p, true).err().unwrap();
        assert!(matches!(e, OpenError::BadHeader), "{e:?}");
        assert_eq!(e.to_string(), "unknown magic or version");
        let _ = std::fs::remove_file(&p);

        let e = Part::open_file(Path::new("/nonexistent-fgpu-dir/account"), true)
            .err()
            .unwrap();
        assert!(matches!(e, OpenError::Open(_)), "{e:?}");
        assert_eq!(e.to_string(), "No such file or directory (os error 2)");

        let e = Part::open_file(Path::new("a\0b"), true).err().unwrap();
        assert!(matches!(e, OpenError::NulInPath(_)), "{e:?}");
    }
}
