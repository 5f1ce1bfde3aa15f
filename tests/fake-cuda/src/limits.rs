//! Driver-native device-memory limits per cgroup: the fake's model of the NVML calls
//! NVIDIA's r615 driver has (`nvmlDeviceSetMemoryLimits_v1`, `nvmlDeviceGetMemoryLimits_v1`).
//!
//! The ABI is the real one (CUDA 13.4's `nvml.h`): the setter takes
//! `nvmlSetMemoryLimits_v1_t { const char *nameSpace; unsigned long long softLimit,
//! hardLimit; }`, the getter `nvmlGetMemoryLimits_v1_t { nameSpace; softLimit, hardLimit,
//! currentUsed; }`; `nameSpace` is the cgroup's full sysfs path. "No limit" is soft 0 and
//! hard `NVML_DEVICE_MEMORY_LIMIT_MAX` (all ones); the fake also clears on hard 0.
//! `FAKE_CUDA_MEMORY_LIMITS=1` advertises the feature; otherwise both calls answer
//! `NVML_ERROR_NOT_SUPPORTED`, as on an older driver.
//!
//! Limits live in `$FAKE_CUDA_STATE.limits` (private memory without `FAKE_CUDA_STATE`): a
//! header and [`ENTRIES`] fixed-size entries (each names its GPU by directory row,
//! `gpus::slot`, so by UUID), read and written under `flock` (and a
//! process mutex, since threads share the descriptor). An entry names its cgroup by the
//! cgroup directory's **inode** when the setter can see it, and by the path relative to
//! the cgroup2 root: a process inside a container with its own cgroup namespace reads
//! `0::/` in `/proc/self/cgroup`, but its `/sys/fs/cgroup` is that same directory, so
//! the inode matches where the path cannot. A process's own cgroup: the `0::<path>` line
//! of `/proc/self/cgroup` under the cgroup2 mount of `/proc/self/mountinfo` (inode of
//! that directory; the path alone when there is no such mount).
//!
//! Enforcement (in every allocation of device memory, `State::take`): a process in a
//! cgroup with a hard limit on the device cannot take the cgroup's total there (the sum
//! of its live processes' memory, from the process table, which records each process's
//! cgroup) past the limit: `CUDA_ERROR_OUT_OF_MEMORY`. The check and the update of the
//! process's figure happen under the lock, so two processes of one cgroup cannot both
//! pass. `cuMemGetInfo` and `nvmlDeviceGetMemoryInfo[_v2]` in such a cgroup report
//! total = the hard limit and free = what the limit leaves (at most what the device
//! has). Only the process's own (leaf) cgroup counts: an ancestor's limit is not applied
//! (the real driver's `dmem` hierarchy is not modelled); the soft limit is stored and
//! reported, never enforced (the fake has no memory pressure). A limit whose cgroup
//! directory is gone no longer holds a place in the table: as under `dmem`, where the
//! limit is the cgroup's and is deleted with it.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Entries in the table.
pub const ENTRIES: usize = 256;
/// Longest `nameSpace` stored (bytes).
pub const PATH_LEN: usize = 472;
/// NVML's `NVML_DEVICE_MEMORY_LIMIT_MAX`: no hard limit.
pub const LIMIT_MAX: u64 = u64::MAX;

const MAGIC: u64 = 0x6667_7075_6c69_6d31; // "fgpulim1"

/// One limit, as stored.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Entry {
    /// Device index + 1; 0 = a free entry.
    dev1: u32,
    path_len: u32,
    /// The cgroup directory's inode (0: the setter could not see it).
    pub inode: u64,
    /// [`path_id`] of the path relative to the cgroup2 root.
    pub path_hash: u64,
    pub soft: u64,
    pub hard: u64,
    path: [u8; PATH_LEN],
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// Entries in use (read without the lock: 0 means no allocation needs to look).
    in_use: AtomicU64,
    _reserved: [u64; 6],
}

const FILE_SIZE: usize = std::mem::size_of::<Header>() + ENTRIES * std::mem::size_of::<Entry>();

/// A cgroup as the fake names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    /// Inode of the cgroup's directory (0: not visible).
    pub inode: u64,
    /// Path relative to the cgroup2 root (`/kubepods.slice/…`, `/` for the root).
    pub rel: String,
}

impl Cgroup {
    /// The id recorded in the process table: the inode, else the path's hash.
    pub fn id(&self) -> u64 {
        if self.inode != 0 {
            self.inode
        } else {
            path_id(&self.rel)
        }
    }
}

/// FNV-1a of a relative cgroup path, with the top bit set (never an inode, never 0).
pub fn path_id(rel: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in rel.trim_end_matches('/').bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | (1 << 63)
}

/// `FAKE_CUDA_MEMORY_LIMITS=1`: the fake advertises the NVML calls.
pub fn advertised() -> bool {
    static A: OnceLock<bool> = OnceLock::new();
    *A.get_or_init(|| std::env::var("FAKE_CUDA_MEMORY_LIMITS").is_ok_and(|v| v.trim() == "1"))
}

/// `nameSpace` names no cgroup (the cgroup2 mount is visible and has no such directory).
#[derive(Debug, PartialEq, Eq)]
pub struct NoSuchCgroup;
/// Every entry of the table is in use.
#[derive(Debug, PartialEq, Eq)]
pub struct TableFull;
/// The cgroup's hard limit refuses the allocation.
#[derive(Debug, PartialEq, Eq)]
pub struct OverLimit;

// ---------------------------------------------------------------- cgroup discovery

/// The path of the `0::<path>` line of a `/proc/<p>/cgroup` text (cgroup v2).
pub fn parse_v2_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_owned())
        .filter(|p| p.starts_with('/'))
}

/// `(root, mount point)` of the first cgroup2 mount of a `/proc/<p>/mountinfo` text.
pub fn parse_cgroup2_mount(text: &str) -> Option<(String, String)> {
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = pre.split_whitespace().collect();
        Some((unescape(f.get(3)?), unescape(f.get(4)?)))
    })
}

/// mountinfo's octal escapes (`\040` for a space, …).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = |j: usize| {
            b.get(j)
                .copied()
                .filter(|c| (b'0'..=b'7').contains(c))
                .map(|c| c - b'0')
        };
        if b[i] == b'\\'
            && let (Some(x), Some(y), Some(z)) = (oct(i + 1), oct(i + 2), oct(i + 3))
        {
            out.push(x.wrapping_mul(64).wrapping_add(y * 8).wrapping_add(z));
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `p` below `prefix` as a path (`/a/b` under `/a` → `/b`; `/a` → `/`), if it is.
fn below(p: &str, prefix: &str) -> Option<String> {
    let rest = p.strip_prefix(prefix.trim_end_matches('/'))?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    let rest = rest.trim_end_matches('/');
    Some(if rest.is_empty() {
        "/".to_owned()
    } else {
        rest.to_owned()
    })
}

/// The directory of cgroup `rel` (relative to this process's cgroup namespace) under a
/// cgroup2 mount of `root` at `mount`.
pub fn cgroup_dir(rel: &str, root: &str, mount: &str) -> Option<PathBuf> {
    let tail = below(rel, root)?;
    let mount = mount.trim_end_matches('/');
    Some(PathBuf::from(if tail == "/" {
        if mount.is_empty() {
            "/".to_owned()
        } else {
            mount.to_owned()
        }
    } else {
        format!("{mount}{tail}")
    }))
}

fn dir_inode(p: &Path) -> Option<u64> {
    let m = std::fs::metadata(p).ok()?;
    use std::os::unix::fs::MetadataExt;
    m.is_dir().then(|| m.ino())
}

fn cgroup2_mount() -> Option<(String, String)> {
    static M: OnceLock<Option<(String, String)>> = OnceLock::new();
    M.get_or_init(|| parse_cgroup2_mount(&std::fs::read_to_string("/proc/self/mountinfo").ok()?))
        .clone()
}

/// The calling process's cgroup (read once: a process does not move by itself).
pub fn own_cgroup() -> &'static Cgroup {
    static C: OnceLock<Cgroup> = OnceLock::new();
    C.get_or_init(|| {
        let rel = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| parse_v2_cgroup(&t))
            .unwrap_or_else(|| "/".to_owned());
        let inode = cgroup2_mount()
            .and_then(|(root, mount)| cgroup_dir(&rel, &root, &mount))
            .and_then(|d| dir_inode(&d))
            .unwrap_or(0);
        Cgroup { inode, rel }
    })
}

/// The cgroup a setter's `nameSpace` names: a path under the cgroup2 mount (the sysfs
/// path NVML documents), or a path relative to the cgroup2 root. Err: the mount is
/// visible and there is no such cgroup.
pub fn resolve(name_space: &str) -> Result<Cgroup, NoSuchCgroup> {
    let ns = name_space.trim();
    match cgroup2_mount() {
        Some((_, mount)) => {
            let (rel, dir) = match below(ns, &mount) {
                Some(rel) => (rel, PathBuf::from(ns)),
                None => {
                    let rel = below(ns, "/sys/fs/cgroup").unwrap_or_else(|| ns.to_owned());
                    let dir = cgroup_dir(&rel, "/", &mount).ok_or(NoSuchCgroup)?;
                    (rel, dir)
                }
            };
            let inode = dir_inode(&dir).ok_or(NoSuchCgroup)?;
            Ok(Cgroup { inode, rel })
        }
        None => Ok(Cgroup {
            inode: 0,
            rel: below(ns, "/sys/fs/cgroup").unwrap_or_else(|| ns.to_owned()),
        }),
    }
}

// ---------------------------------------------------------------- the table

/// A limits table: the shared file or private memory.
pub struct Table {
    base: *mut u8,
    /// The file, for `flock` (None: private).
    file: Option<crate::pidns::KeptFd>,
    mutex: Mutex<()>,
}

// SAFETY: the mapping is only touched under `mutex` (+ flock) or through atomics.
unsafe impl Sync for Table {}
// SAFETY: as above; the pointer is to a mapping that lives as long as the process.
unsafe impl Send for Table {}

/// Holds the table's locks; entries are read and written only through it.
pub struct Guard<'a> {
    t: &'a Table,
    /// The descriptor `flock`ed (-1: none).
    locked: c_int,
    _m: MutexGuard<'a, ()>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.locked >= 0 {
            // SAFETY: the descriptor this guard locked.
            unsafe { libc::flock(self.locked, libc::LOCK_UN) };
        }
    }
}

fn map_private() -> *mut u8 {
    // SAFETY: anonymous zeroed mapping.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(
        m != libc::MAP_FAILED,
        "fake-cuda: cannot map the limits table"
    );
    m as *mut u8
}

impl Table {
    /// A table private to the process.
    pub fn private() -> Table {
        Table {
            base: map_private(),
            file: None,
            mutex: Mutex::new(()),
        }
    }

    /// `path`, created and grown as needed (zero bytes: an empty table); None if it cannot.
    fn file(path: &str) -> Option<Table> {
        let m = crate::shm::map_shared(path, FILE_SIZE)?;
        Some(Table {
            base: m,
            file: Some(crate::pidns::KeptFd::new(path)?),
            mutex: Mutex::new(()),
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (atomics only; all-zero is valid).
        unsafe { &*(self.base as *const Header) }
    }

    /// Whether any limit is set (no lock: a hint for the allocation path).
    pub fn any(&self) -> bool {
        self.header().in_use.load(Ordering::Acquire) != 0
    }

    pub fn lock(&self) -> Guard<'_> {
        let m = self.mutex.lock().unwrap_or_else(|e| e.into_inner());
        let mut locked = -1;
        if let Some((fd, _)) = self.file.as_ref().and_then(crate::pidns::KeptFd::get) {
            // SAFETY: fd names the table's file (just checked); blocks until the others
            // let go.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
                locked = fd;
            }
        }
        Guard {
            t: self,
            locked,
            _m: m,
        }
    }
}

impl Guard<'_> {
    fn entry(&self, i: usize) -> *mut Entry {
        assert!(i < ENTRIES);
        // SAFETY: within the mapping: header + ENTRIES entries.
        unsafe {
            self.t
                .base
                .add(std::mem::size_of::<Header>() + i * std::mem::size_of::<Entry>())
                as *mut Entry
        }
    }

    fn read(&self, i: usize) -> Entry {
        // SAFETY: an entry of the mapping, read under the locks (plain data, any bytes valid).
        unsafe { self.entry(i).read() }
    }

    fn matches(e: &Entry, dev: usize, cg: &Cgroup) -> bool {
        e.dev1 as usize == crate::gpus::slot(dev) + 1
            && if cg.inode != 0 && e.inode != 0 {
                e.inode == cg.inode
            } else {
                e.path_hash == path_id(&cg.rel)
            }
    }

    /// Whether an entry's cgroup directory is gone (deleted, or another directory got its
    /// inode): under `dmem` a limit lives in its cgroup and dies with it, so the entry is
    /// free for the next limit set (the table does not fill up with dead containers').
    fn gone(e: &Entry) -> bool {
        // (A process that cannot see a cgroup2 mount resolves every path to inode 0: it
        // cannot tell, and keeps the entry.)
        e.dev1 != 0
            && e.inode != 0
            && resolve(e.path()).map_or(true, |c| c.inode != 0 && c.inode != e.inode)
    }

    fn index(&self, dev: usize, cg: &Cgroup) -> Option<usize> {
        (0..ENTRIES).find(|&i| Self::matches(&self.read(i), dev, cg))
    }

    /// The limit on `dev` of cgroup `cg`, if any.
    pub fn find(&self, dev: usize, cg: &Cgroup) -> Option<Entry> {
        self.index(dev, cg).map(|i| self.read(i))
    }

    /// Sets (soft, hard) on `dev` for `cg`; `path` is kept for display.
    pub fn set(
        &self,
        dev: usize,
        cg: &Cgroup,
        path: &str,
        soft: u64,
        hard: u64,
    ) -> Result<(), TableFull> {
        let i = match self.index(dev, cg) {
            Some(i) => i,
            None => (0..ENTRIES)
                .find(|&i| self.read(i).dev1 == 0)
                .or_else(|| (0..ENTRIES).find(|&i| Self::gone(&self.read(i))))
                .ok_or(TableFull)?,
        };
        let was_free = self.read(i).dev1 == 0;
        let mut e = Entry {
            dev1: crate::gpus::slot(dev) as u32 + 1,
            path_len: 0,
            inode: cg.inode,
            path_hash: path_id(&cg.rel),
            soft,
            hard,
            path: [0; PATH_LEN],
        };
        let n = path.len().min(PATH_LEN);
        e.path[..n].copy_from_slice(&path.as_bytes()[..n]);
        e.path_len = n as u32;
        // SAFETY: an entry of the mapping, written under the locks.
        unsafe { self.entry(i).write(e) };
        let h = self.t.header();
        h.magic.store(MAGIC, Ordering::Relaxed);
        if was_free {
            h.in_use.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Removes the limit on `dev` of `cg` (nothing when there is none).
    pub fn clear(&self, dev: usize, cg: &Cgroup) {
        if let Some(i) = self.index(dev, cg) {
            // SAFETY: an entry of the mapping, written under the locks.
            unsafe { self.entry(i).write(std::mem::zeroed()) };
            self.t.header().in_use.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Entry {
    pub fn path(&self) -> &str {
        std::str::from_utf8(&self.path[..(self.path_len as usize).min(PATH_LEN)]).unwrap_or("")
    }
}

/// The process's table: `$FAKE_CUDA_STATE.limits`, or private.
pub fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        crate::gpus::shared_path()
            .and_then(|p| Table::file(&format!("{p}.limits")))
            .unwrap_or_else(Table::private)
    })
}

// ---------------------------------------------------------------- policy

/// Whether a cgroup whose other processes hold `others` bytes on a device may have this
/// process hold `new` there under hard limit `hard`.
pub fn fits(others: u64, new: u64, hard: u64) -> bool {
    hard == LIMIT_MAX || others.saturating_add(new) <= hard
}

/// (total, free) a process holding `used` of a `size`-byte device sees, its cgroup's
/// other processes holding `others` under hard limit `hard` (None: no limit).
pub fn visible(size: u64, used: u64, others: u64, hard: Option<u64>) -> (u64, u64) {
    let dev_free = size.saturating_sub(used);
    match hard {
        Some(h) if h != LIMIT_MAX => (h, dev_free.min(h.saturating_sub(others + used))),
        _ => (size, dev_free),
    }
}

/// The allocation path: this process, holding `old` bytes on `dev`, may now hold `new`.
/// Records the figure in the process table; Err when the cgroup's hard limit refuses an
/// increase (taking nothing, as a context of size 0, is never refused).
pub fn charge(dev: usize, old: u64, new: u64) -> Result<(), OverLimit> {
    let t = table();
    if new <= old || !t.any() {
        crate::procs::set_used(dev, new);
        return Ok(());
    }
    let cg = own_cgroup();
    let g = t.lock();
    if let Some(e) = g.find(dev, cg) {
        let others = crate::procs::cgroup_used(dev, cg.id(), true);
        if !fits(others, new, e.hard) {
            return Err(OverLimit);
        }
    }
    crate::procs::set_used(dev, new);
    drop(g);
    Ok(())
}

/// (total, free) for `cuMemGetInfo` / NVML memory info of this process on `dev`.
pub fn visible_memory(dev: usize, size: u64, used: u64) -> (u64, u64) {
    let t = table();
    if !t.any() {
        return visible(size, used, 0, None);
    }
    let cg = own_cgroup();
    let g = t.lock();
    let hard = g.find(dev, cg).map(|e| e.hard);
    let others = match hard {
        Some(_) => crate::procs::cgroup_used(dev, cg.id(), true),
        None => 0,
    };
    drop(g);
    visible(size, used, others, hard)
}

/// The total of a cgroup's live processes on `dev` (the getter's `currentUsed`).
pub fn cgroup_total(dev: usize, cg: &Cgroup) -> u64 {
    let by_inode = if cg.inode != 0 {
        crate::procs::cgroup_used(dev, cg.inode, false)
    } else {
        0
    };
    by_inode + crate::procs::cgroup_used(dev, path_id(&cg.rel), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines_and_mounts() {
        let cg =
            "12:memory:/x\n1:name=systemd:/\n0::/kubepods.slice/pod1/cri-containerd-ab.scope\n";
        assert_eq!(
            parse_v2_cgroup(cg).as_deref(),
            Some("/kubepods.slice/pod1/cri-containerd-ab.scope")
        );
        assert_eq!(parse_v2_cgroup("4:memory:/x\n"), None);
        let mi = "22 1 0:20 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro\n\
                  30 22 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_cgroup2_mount(mi),
            Some(("/".into(), "/sys/fs/cgroup/unified".into()))
        );
        let esc = "30 22 0:26 /a\\040b /mnt/cg\\040x rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_cgroup2_mount(esc),
            Some(("/a b".into(), "/mnt/cg x".into()))
        );
        assert_eq!(
            parse_cgroup2_mount("22 1 0:20 / /sys rw - sysfs sysfs rw\n"),
            None
        );
    }

    #[test]
    fn cgroup_directories() {
        // The host: the root's mount, any cgroup below it.
        assert_eq!(
            cgroup_dir("/kubepods/p/c", "/", "/sys/fs/cgroup"),
            Some(PathBuf::from("/sys/fs/cgroup/kubepods/p/c"))
        );
        // A container with its own cgroup namespace: it is the root of its mount.
        assert_eq!(
            cgroup_dir("/", "/", "/sys/fs/cgroup"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        // A container without one, its own cgroup mounted: the mount's root is its path.
        assert_eq!(
            cgroup_dir("/kubepods/p/c", "/kubepods/p/c", "/sys/fs/cgroup"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(cgroup_dir("/other", "/kubepods", "/sys/fs/cgroup"), None);
        assert_eq!(
            cgroup_dir("/kubepodsX", "/kubepods", "/sys/fs/cgroup"),
            None
        );
    }

    #[test]
    fn the_own_cgroup_is_found() {
        let cg = own_cgroup();
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(Some(cg.rel.clone()), parse_v2_cgroup(&text));
        if let Some((root, mount)) = cgroup2_mount() {
            let dir = cgroup_dir(&cg.rel, &root, &mount).unwrap();
            assert_eq!(cg.inode, dir_inode(&dir).unwrap());
            // The setter names it by its sysfs path or by its cgroup path: the same cgroup.
            assert_eq!(
                resolve(dir.to_str().unwrap()).map(|c| c.inode),
                Ok(cg.inode)
            );
            assert_eq!(resolve(&cg.rel).map(|c| c.inode), Ok(cg.inode));
            assert_eq!(resolve("/no/such/fgpu/cgroup"), Err(NoSuchCgroup));
        }
    }

    fn cg(inode: u64, rel: &str) -> Cgroup {
        Cgroup {
            inode,
            rel: rel.into(),
        }
    }

    #[test]
    fn a_full_table_takes_the_place_of_a_limit_whose_cgroup_is_gone() {
        let t = Table::private();
        let g = t.lock();
        // Every entry's cgroup is gone (no such directory, wherever cgroup2 is mounted).
        for i in 0..ENTRIES {
            let c = cg(1000 + i as u64, &format!("/fgpu-gone-{i}"));
            g.set(0, &c, &format!("/no/such/fgpu/cgroup/{i}"), 0, 1 << 20)
                .unwrap();
        }
        assert_eq!(t.header().in_use.load(Ordering::Relaxed), ENTRIES as u64);
        let live = cg(5000, "/live");
        g.set(0, &live, "/no/such/fgpu/cgroup/live", 0, 2 << 20)
            .unwrap();
        assert_eq!(g.find(0, &live).map(|e| e.hard), Some(2 << 20));
        assert_eq!(t.header().in_use.load(Ordering::Relaxed), ENTRIES as u64);
    }

    #[test]
    fn set_find_replace_clear() {
        let t = Table::private();
        assert!(!t.any());
        let a = cg(100, "/a");
        let b = cg(200, "/b");
        {
            let g = t.lock();
            assert!(g.find(0, &a).is_none());
            g.set(0, &a, "/sys/fs/cgroup/a", 1 << 20, 4 << 20).unwrap();
            g.set(1, &a, "/sys/fs/cgroup/a", 0, 8 << 20).unwrap();
            assert_eq!(
                g.find(0, &a).map(|e| (e.soft, e.hard)),
                Some((1 << 20, 4 << 20))
            );
            assert_eq!(g.find(0, &a).unwrap().path(), "/sys/fs/cgroup/a");
            assert_eq!(g.find(1, &a).map(|e| e.hard), Some(8 << 20));
            assert!(g.find(0, &b).is_none());
            // Replacing keeps one entry.
            g.set(0, &a, "/sys/fs/cgroup/a", 0, 2 << 20).unwrap();
            assert_eq!(g.find(0, &a).map(|e| e.hard), Some(2 << 20));
        }
        assert!(t.any());
        assert_eq!(t.header().in_use.load(Ordering::Relaxed), 2);
        {
            let g = t.lock();
            // A process that sees only the path (no cgroup mount) matches by the path.
            assert_eq!(g.find(0, &cg(0, "/a")).map(|e| e.hard), Some(2 << 20));
            // A different cgroup at the same path (re-created: a new inode) does not.
            assert!(g.find(0, &cg(101, "/a")).is_none());
            g.clear(0, &a);
            assert!(g.find(0, &a).is_none());
            assert!(g.find(1, &a).is_some());
            g.clear(1, &a);
            g.clear(1, &a);
        }
        assert!(!t.any());
    }

    #[test]
    fn a_full_table_refuses_a_new_cgroup_but_replaces() {
        let t = Table::private();
        let g = t.lock();
        // Cgroups known by path only (no inode): none can be judged gone.
        for i in 0..ENTRIES {
            let p = format!("/x{i}");
            g.set(0, &cg(0, &p), &p, 0, 1).unwrap();
        }
        assert_eq!(g.set(0, &cg(0, "/y"), "/y", 0, 1), Err(TableFull));
        assert_eq!(g.set(0, &cg(0, "/x0"), "/x0", 0, 2), Ok(()));
    }

    #[test]
    fn refusal_and_visible_memory() {
        const M: u64 = 1 << 20;
        assert!(fits(300 * M, 700 * M, 1024 * M));
        assert!(fits(324 * M, 700 * M, 1024 * M));
        assert!(!fits(325 * M, 700 * M, 1024 * M));
        assert!(fits(u64::MAX, 1, LIMIT_MAX));
        // No limit: the device.
        assert_eq!(
            visible(80 * 1024 * M, 10 * M, 0, None),
            (80 * 1024 * M, 80 * 1024 * M - 10 * M)
        );
        // A limit: its total, what it leaves (other processes of the cgroup included).
        assert_eq!(
            visible(80 * 1024 * M, 100 * M, 300 * M, Some(1024 * M)),
            (1024 * M, 624 * M)
        );
        // Past it already (set below the usage): nothing free.
        assert_eq!(
            visible(80 * 1024 * M, 900 * M, 300 * M, Some(1024 * M)),
            (1024 * M, 0)
        );
        // The device is smaller than the limit leaves.
        assert_eq!(
            visible(512 * M, 500 * M, 0, Some(1024 * M)),
            (1024 * M, 12 * M)
        );
    }

    #[test]
    fn path_ids() {
        assert_eq!(path_id("/a/b"), path_id("/a/b/"));
        assert_ne!(path_id("/a/b"), path_id("/a/c"));
        assert!(path_id("/") >> 63 == 1);
    }
}
