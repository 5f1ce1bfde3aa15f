//! Processes across PID namespaces: how a process is named in the shared tables, how
//! another process tells whether it is alive, and the PID a host-side reader reports.
//!
//! A process in a container has its own PID namespace: its `getpid()` means nothing (or
//! another process) outside it, and two containers' processes often have the same PID.
//! So the shared tables (`procs.rs`, `timeline.rs`) name a process by a **key**: its
//! PID-namespace inode (`/proc/self/ns/pid`, `pid:[N]`) in the high 32 bits and its PID in
//! that namespace in the low 32 (inode 0: `/proc` was not readable, the PID alone).
//!
//! **Liveness.** The process list also records each process's start time (ticks since
//! boot, the same in every namespace): a dead container's namespace inode is soon
//! reused, and its PID 1 with it. A process of the reader's own namespace is checked
//! with `kill(pid, 0)` and its start time; one of another namespace that the reader's
//! `/proc` shows, by that process and its start time; one it cannot see (another
//! container's) by its liveness lock: every writer holds a POSIX record lock on one
//! byte of `$FAKE_CUDA_STATE.live`, at an offset made from its key ([`lock_offset`]),
//! for as long as it lives (the kernel drops it when the process dies; a forked child is
//! another process and takes its own), and a reader asks `F_GETLK` whether that byte is
//! locked by someone else.
//!
//! **Host view** (`FAKE_CUDA_NVML_HOST=1`, the node monitor): NVML on a host reports each
//! process's PID as the host sees it. A slot of the reader's namespace is reported as is;
//! another's is translated through the reader's `/proc`: the process `<p>` whose
//! `/proc/<p>/ns/pid` is the slot's namespace and whose `NSpid:` line in
//! `/proc/<p>/status` ends with the slot's PID. Translations are cached and re-checked at
//! each use, with the start time; a slot that cannot be translated (a dead process, or
//! a namespace the reader cannot see into) is left out.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// PIDs are below 2^22 (the kernel's `PID_MAX_LIMIT` on 64-bit).
pub const PID_BITS: u32 = 22;

/// The key of the process with PID `pid` in the namespace of inode `ns`.
pub fn key(ns: u32, pid: u32) -> u64 {
    (u64::from(ns) << 32) | u64::from(pid)
}

pub fn key_ns(k: u64) -> u32 {
    (k >> 32) as u32
}

pub fn key_pid(k: u64) -> u32 {
    k as u32
}

/// `pid:[4026531836]` → 4026531836 (a namespace inode fits 32 bits: the kernel's `inum`).
pub fn parse_ns_link(link: &str) -> Option<u32> {
    link.trim()
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The PID-namespace inode behind a `…/ns/pid` link.
pub fn ns_of(link: &Path) -> Option<u32> {
    parse_ns_link(std::fs::read_link(link).ok()?.to_str()?)
}

/// The last PID of the `NSpid:` line of a `/proc/<p>/status` text: the process's PID in
/// its own (innermost) namespace.
pub fn parse_nspid_last(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// The calling process's PID-namespace inode (0 when `/proc` cannot tell).
pub fn own_ns() -> u32 {
    key_ns(own_key())
}

/// The start time of a `/proc/<p>/stat` text (field 22: clock ticks after boot, the same
/// in every PID namespace): with the key it tells a process from a later one that got
/// the same namespace inode (inodes are reused) and PID.
pub fn parse_stat_start(stat: &str) -> Option<u64> {
    // Fields after the command name (which may hold spaces and parentheses): 3, 4, …
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

fn start_at(proc_dir: &Path) -> Option<u64> {
    parse_stat_start(&std::fs::read_to_string(proc_dir.join("stat")).ok()?)
}

static OWN_PID: AtomicU32 = AtomicU32::new(0);
static OWN_KEY: AtomicU64 = AtomicU64::new(0);
static OWN_START: AtomicU64 = AtomicU64::new(0);

/// The calling process's key, recomputed when the PID changed (a forked child).
pub fn own_key() -> u64 {
    let pid = getpid();
    if OWN_PID.load(Ordering::Acquire) == pid {
        return OWN_KEY.load(Ordering::Acquire);
    }
    let ns = ns_of(Path::new("/proc/self/ns/pid")).unwrap_or(0);
    let k = key(ns, pid);
    let start = start_at(Path::new("/proc/self")).unwrap_or(0);
    OWN_KEY.store(k, Ordering::Release);
    OWN_START.store(start, Ordering::Release);
    OWN_PID.store(pid, Ordering::Release);
    k
}

/// The calling process's start time (0: `/proc` cannot tell).
pub fn own_start() -> u64 {
    own_key();
    OWN_START.load(Ordering::Acquire)
}

fn kill_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The byte of the liveness file a process of key `k` locks: unique per key (PIDs have
/// [`PID_BITS`] bits), and a non-negative `off_t`.
pub fn lock_offset(k: u64) -> libc::off_t {
    ((u64::from(key_ns(k)) << PID_BITS) | u64::from(key_pid(k) & ((1 << PID_BITS) - 1)))
        as libc::off_t
}

/// A descriptor of a state file that the fake keeps open, checked before each use: a
/// program may close descriptors it did not open (`closefrom`, `close_range`), and the
/// number may then name another file. Reopened when it no longer names the file.
pub struct KeptFd {
    path: CString,
    /// (descriptor, st_dev, st_ino); -1 when not open.
    cur: Mutex<(libc::c_int, u64, u64)>,
}

fn fstat_id(fd: libc::c_int) -> Option<(u64, u64)> {
    // SAFETY: st is a valid out-buffer; fstat of any number is safe (EBADF at worst).
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

impl KeptFd {
    pub fn new(path: &str) -> Option<KeptFd> {
        let k = KeptFd {
            path: CString::new(path).ok()?,
            cur: Mutex::new((-1, 0, 0)),
        };
        k.get()?;
        Some(k)
    }

    /// The descriptor, and whether it was (re)opened by this call (so locks taken through
    /// the earlier one are gone). None: the file cannot be opened.
    pub fn get(&self) -> Option<(libc::c_int, bool)> {
        let mut c = self.cur.lock().unwrap_or_else(|e| e.into_inner());
        if c.0 >= 0 && fstat_id(c.0) == Some((c.1, c.2)) {
            return Some((c.0, false));
        }
        // (The old number, if any, is not ours any more: never closed here.)
        // SAFETY: path is a valid C string.
        let fd = unsafe {
            libc::open(
                self.path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o666,
            )
        };
        if fd < 0 {
            return None;
        }
        let (dev, ino) = fstat_id(fd)?;
        *c = (fd, dev, ino);
        Some((fd, true))
    }
}

/// `$FAKE_CUDA_STATE.live` (kept open: closing any descriptor of the file would drop the
/// process's locks). None: no shared state, or not openable.
fn live_fd() -> Option<&'static KeptFd> {
    static FD: OnceLock<Option<KeptFd>> = OnceLock::new();
    FD.get_or_init(|| {
        let p = std::env::var("FAKE_CUDA_STATE")
            .ok()
            .filter(|p| !p.is_empty())?;
        KeptFd::new(&format!("{p}.live"))
    })
    .as_ref()
}

fn flock_at(kind: libc::c_int, off: libc::off_t) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is valid before the fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = off;
    fl.l_len = 1;
    fl
}

/// Marks the calling process alive for the others (once per process; a forked child
/// calls it again for its own PID). Call before writing the own key into a table.
/// `check`: also re-take the lock if the descriptor it was taken through was closed by
/// the program (context creation checks; the launch path only registers once).
pub fn register(check: bool) {
    static DONE_FOR: AtomicU32 = AtomicU32::new(0);
    let pid = getpid();
    let done = DONE_FOR.load(Ordering::Acquire) == pid;
    if done && !check {
        return;
    }
    if let Some((fd, reopened)) = live_fd().and_then(KeptFd::get)
        && (!done || reopened)
    {
        let fl = flock_at(libc::F_WRLCK, lock_offset(own_key()));
        // SAFETY: fd is open; fl is a valid flock. A failure leaves the process judged by
        // `kill` and `/proc` only, as without shared state.
        unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) };
    }
    DONE_FOR.store(pid, Ordering::Release);
}

/// Whether another process holds the liveness lock of key `k` (None: no liveness file).
fn lock_held(k: u64) -> Option<bool> {
    let (fd, _) = live_fd()?.get()?;
    let mut fl = flock_at(libc::F_WRLCK, lock_offset(k));
    // SAFETY: fd is open; fl is a valid, writable flock.
    let r = unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) };
    (r == 0).then_some(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn translator() -> MutexGuard<'static, Translator> {
    static T: OnceLock<Mutex<Translator>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(Translator::new("/proc")))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Whether process `p` of the caller's `/proc` is the one that started at `start`
/// (0: not recorded, any is).
fn same_start(p: u32, start: u64) -> bool {
    start == 0 || start_at(&Path::new("/proc").join(p.to_string())).is_none_or(|s| s == start)
}

/// Whether the process of key `k` that started at `start` (0: unknown) is alive, as far
/// as the caller can tell. Its own key is. One of the caller's namespace (or of an
/// unknown one): `kill(pid, 0)` and the start time. One of another namespace: found in
/// the caller's `/proc` (namespace, innermost PID) with that start time — a dead
/// container's namespace inode is soon reused, and its PID 1 with it — or, when the
/// caller cannot see it (another container's), by its liveness lock; alive when there is
/// neither (it cannot be told, and reusing a live process's slot is worse).
pub fn alive_since(k: u64, start: u64) -> bool {
    let me = own_key();
    if k == me {
        return true;
    }
    let ns = key_ns(k);
    if ns == 0 || ns == key_ns(me) {
        return kill_alive(key_pid(k)) && same_start(key_pid(k), start);
    }
    if let Some(p) = translator().lookup(k, key_ns(me), &mut false) {
        return same_start(p, start);
    }
    lock_held(k) != Some(false)
}

/// [`alive_since`] without a recorded start time.
pub fn alive(k: u64) -> bool {
    alive_since(k, 0)
}

/// Translates keys of other PID namespaces to PIDs of the reader's `/proc`.
pub struct Translator {
    root: PathBuf,
    /// key → PID in the reader's namespace, as of the last scan (re-checked at each use).
    map: HashMap<u64, u32>,
}

impl Translator {
    pub fn new(root: impl Into<PathBuf>) -> Translator {
        Translator {
            root: root.into(),
            map: HashMap::new(),
        }
    }

    /// The key of process `p` of the reader's `/proc` (None: gone, or unreadable).
    fn key_of(&self, p: u32) -> Option<u64> {
        let dir = self.root.join(p.to_string());
        let ns = ns_of(&dir.join("ns/pid"))?;
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        Some(key(ns, parse_nspid_last(&status)?))
    }

    /// Rebuilds the map from every process of the reader's `/proc` (keys of the reader's
    /// own namespace `skip_ns` are not needed: they are reported as they are).
    fn rescan(&mut self, skip_ns: u32) {
        self.map.clear();
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // The namespace first: the status file only of another namespace's process.
            let Some(ns) = ns_of(&e.path().join("ns/pid")) else {
                continue;
            };
            if ns == skip_ns && skip_ns != 0 {
                continue;
            }
            if let Some(k) = self.key_of(p) {
                self.map.insert(k, p);
            }
        }
    }

    /// The reader-namespace PID of key `k`; `scanned`: whether this batch already rescanned
    /// (at most one `/proc` scan per batch of lookups).
    pub fn lookup(&mut self, k: u64, reader_ns: u32, scanned: &mut bool) -> Option<u32> {
        if let Some(&p) = self.map.get(&k) {
            if self.key_of(p) == Some(k) {
                return Some(p);
            }
            self.map.remove(&k);
        }
        if *scanned {
            return None;
        }
        *scanned = true;
        self.rescan(reader_ns);
        self.map.get(&k).copied()
    }
}

/// `FAKE_CUDA_NVML_HOST=1`: the reader reports PIDs as its own namespace sees them.
pub fn host_mode() -> bool {
    static H: OnceLock<bool> = OnceLock::new();
    *H.get_or_init(|| std::env::var("FAKE_CUDA_NVML_HOST").is_ok_and(|v| v.trim() == "1"))
}

/// The host view of `procs` (`(key, start time)`, in order): the PID the reader's
/// namespace knows each live process by, None for one left out (dead, or not visible
/// from here). Another namespace's process is the one the reader's `/proc` shows with
/// its namespace, innermost PID and start time (it exists, whatever its liveness lock).
pub fn host_pids(procs: &[(u64, u64)]) -> Vec<Option<u32>> {
    let mut t = translator();
    let me = own_ns();
    let mut scanned = false;
    procs
        .iter()
        .map(|&(k, start)| {
            let ns = key_ns(k);
            let p = if ns == me || ns == 0 {
                Some(key_pid(k)).filter(|&p| kill_alive(p))
            } else {
                t.lookup(k, me, &mut scanned)
            };
            p.filter(|&p| same_start(p, start))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_pack_namespace_and_pid() {
        let k = key(4026531836, 4_194_303);
        assert_eq!(key_ns(k), 4026531836);
        assert_eq!(key_pid(k), 4_194_303);
        // Two namespaces' PID 1 are two keys, and two lock bytes.
        assert_ne!(key(4026532178, 1), key(4026532179, 1));
        assert_ne!(
            lock_offset(key(4026532178, 1)),
            lock_offset(key(4026532179, 1))
        );
        assert_ne!(
            lock_offset(key(4026532178, 1)),
            lock_offset(key(4026532178, 2))
        );
        assert!(lock_offset(key(u32::MAX, 4_194_303)) > 0);
    }

    #[test]
    fn namespace_links_and_nspid_lines() {
        assert_eq!(parse_ns_link("pid:[4026532178]"), Some(4026532178));
        assert_eq!(parse_ns_link("net:[4026532178]"), None);
        assert_eq!(parse_ns_link("pid:[x]"), None);
        let st = "Name:\tfgpu-bypass\nTgid:\t812\nPid:\t812\nNSpid:\t812\t7\t1\nNSpgid:\t812\n";
        assert_eq!(parse_nspid_last(st), Some(1));
        assert_eq!(parse_nspid_last("NSpid:\t42\n"), Some(42));
        assert_eq!(parse_nspid_last("Pid:\t42\n"), None);
    }

    #[test]
    fn start_times() {
        let st = "812 (fgpu) bypass) S 1 812 812 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 1 0 987654 12345 67";
        assert_eq!(parse_stat_start(st), Some(987654));
        assert_eq!(parse_stat_start("812 (x) S 1"), None);
        let me = own_start();
        assert!(me > 0);
        assert_eq!(start_at(Path::new("/proc/self")), Some(me));
        // The same PID with another start time is another (later) process.
        let k = own_key();
        assert!(alive_since(key(key_ns(k), 1), 0));
        let init = start_at(Path::new("/proc/1")).unwrap();
        assert!(alive_since(key(key_ns(k), 1), init));
        assert!(!alive_since(key(key_ns(k), 1), init + 1));
    }

    #[test]
    fn own_key_is_this_process_in_its_namespace() {
        let k = own_key();
        assert_eq!(key_pid(k), std::process::id());
        assert_eq!(Some(key_ns(k)), ns_of(Path::new("/proc/self/ns/pid")));
        assert!(alive(k));
        // The same namespace: judged by kill; a PID nobody has is dead.
        assert!(!alive(key(key_ns(k), 4_194_303)));
    }

    #[test]
    fn a_kept_descriptor_closed_behind_its_back_is_reopened() {
        let path = std::env::temp_dir().join(format!("fgpu-keptfd-{}", std::process::id()));
        let other = std::env::temp_dir().join(format!("fgpu-keptfd-o-{}", std::process::id()));
        let k = KeptFd::new(path.to_str().unwrap()).unwrap();
        let (fd, reopened) = k.get().unwrap();
        assert!(!reopened);
        assert_eq!(k.get(), Some((fd, false)));
        // The program closes it and the number is reused for another file.
        let f = std::fs::File::create(&other).unwrap();
        // SAFETY: fd is the test's own descriptor; dup2 over it with a file it owns.
        unsafe {
            assert_eq!(libc::close(fd), 0);
            assert_eq!(libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&f), fd), fd);
        }
        let (fd2, reopened) = k.get().unwrap();
        assert!(reopened);
        assert_ne!(fd2, fd);
        assert_eq!(
            fstat_id(fd2),
            std::fs::metadata(&path).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            })
        );
        assert_eq!(k.get(), Some((fd2, false)));
        // SAFETY: the dup2'd number is the test's.
        unsafe { libc::close(fd) };
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&other);
    }

    /// A fake `/proc` tree: `(pid, namespace inode, NSpid line)`.
    fn fake_proc(name: &str, procs: &[(u32, u32, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("fgpu-pidns-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for &(p, ns, nspid) in procs {
            let d = root.join(p.to_string());
            std::fs::create_dir_all(d.join("ns")).unwrap();
            std::os::unix::fs::symlink(format!("pid:[{ns}]"), d.join("ns/pid")).unwrap();
            std::fs::write(d.join("status"), format!("Name:\tx\nNSpid:\t{nspid}\n")).unwrap();
        }
        root
    }

    #[test]
    fn translation_matches_namespace_and_innermost_pid() {
        let root = fake_proc(
            "tr",
            &[
                (100, 10, "100"),    // the reader's namespace
                (200, 20, "200\t1"), // container A's PID 1
                (201, 20, "201\t5"),
                (300, 30, "300\t1"), // container B's PID 1
            ],
        );
        let mut t = Translator::new(&root);
        let mut scanned = false;
        assert_eq!(t.lookup(key(20, 1), 10, &mut scanned), Some(200));
        assert!(scanned);
        // The batch's scan is reused: no rescan, cached answers.
        assert_eq!(t.lookup(key(30, 1), 10, &mut scanned), Some(300));
        assert_eq!(t.lookup(key(20, 5), 10, &mut scanned), Some(201));
        // Unknown: not found (and not rescanned again in this batch).
        assert_eq!(t.lookup(key(20, 9), 10, &mut scanned), None);
        // A process of the reader's own namespace is not a translation target.
        assert_eq!(t.lookup(key(10, 100), 10, &mut false), None);
        // The cached 200 dies and PID 200 is reused by another namespace's process: the
        // cached answer is re-checked and dropped, a rescan finds where PID 1 of 20 went.
        std::fs::remove_dir_all(root.join("200")).unwrap();
        std::fs::remove_dir_all(root.join("201")).unwrap();
        let again = fake_proc("tr2", &[(200, 30, "200\t2"), (250, 20, "250\t1")]);
        for p in ["200", "250"] {
            std::fs::rename(again.join(p), root.join(p)).unwrap();
        }
        let mut scanned = false;
        assert_eq!(t.lookup(key(20, 1), 10, &mut scanned), Some(250));
        assert_eq!(t.lookup(key(20, 5), 10, &mut scanned), None);
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&again);
    }
}
