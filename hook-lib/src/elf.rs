//! Finds a symbol in the loaded libraries' own dynamic symbol tables, without `dlsym`
//! or `dlvsym`: the shim exports both, so a call of ours by either name would reach
//! itself. Used once, to find glibc's `dlvsym`; and [`vdso_function`] finds a function
//! of the kernel's vDSO (the core limiter's clock, called without libc's wrapper).
//!
//! Walks the loaded objects (`dl_iterate_phdr`, in load order), skipping the program,
//! the vDSO and libfgpu.so itself, and looks the name up in each one's GNU hash table
//! (or its SysV hash table): the first defined function of that name at its default
//! version (not a hidden, older version) wins, as the dynamic linker's own lookup
//! would, starting after libfgpu.so.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::null_mut;

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

struct Search<'a> {
    name: &'a CStr,
    own_base: usize,
    found: *mut c_void,
}

/// The GNU hash of a symbol name.
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// Address of `name`, a defined function at its default version, in the first loaded
/// object after libfgpu.so that has it; null if none does.
pub fn find_default(name: &CStr) -> *mut c_void {
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr with the address of one of our own functions and a valid out-struct.
    let own_base = if unsafe { libc::dladdr(find_default as *const c_void, &mut info) } != 0 {
        info.dli_fbase as usize
    } else {
        0
    };
    let mut s = Search {
        name,
        own_base,
        found: null_mut(),
    };
    // SAFETY: the callback only reads the loaded objects' mapped headers and tables.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut s as *mut Search<'_>).cast()) };
    s.found
}

fn unsafe_zeroed() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: null_mut(),
    }
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our own data pointer.
    let (info, s) = unsafe { (&*info, &mut *(data as *mut Search<'_>)) };
    let base = info.dlpi_addr as usize;
    let name: &[u8] = if info.dlpi_name.is_null() {
        b""
    } else {
        // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    if name.is_empty() || name.starts_with(b"linux-vdso") || (base == s.own_base && base != 0) {
        return 0;
    }
    for i in 0..usize::from(info.dlpi_phnum) {
        // SAFETY: dlpi_phdr holds dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type != libc::PT_DYNAMIC {
            continue;
        }
        let dynamic = (base + ph.p_vaddr as usize) as *const Dyn;
        // SAFETY: the PT_DYNAMIC segment of a loaded object is mapped and terminated by
        // DT_NULL; the tables it points to are mapped too.
        let p = unsafe { lookup(dynamic, base, s.name, false) };
        if !p.is_null() && !is_own(p, s.own_base) {
            s.found = p;
            return 1;
        }
    }
    0
}

/// Address of the vDSO's function `name` (vdso(7): e.g. `__vdso_clock_gettime` on
/// x86_64, `__kernel_clock_gettime` on aarch64); null if there is no vDSO or it has no
/// such function. The vDSO is found from the auxiliary vector (`AT_SYSINFO_EHDR`), not
/// from the loader's list, and its addresses are always taken relative to its load bias.
pub fn vdso_function(name: &CStr) -> *mut c_void {
    // SAFETY: getauxval has no preconditions; 0 means absent.
    let ehdr = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    if ehdr == 0 {
        return null_mut();
    }
    // SAFETY: the kernel maps the vDSO, a complete ELF image, at AT_SYSINFO_EHDR.
    let eh = unsafe { &*(ehdr as *const libc::Elf64_Ehdr) };
    if eh.e_ident[..4] != *b"\x7fELF" || eh.e_ident[4] != 2 {
        return null_mut(); // not a 64-bit ELF image
    }
    let phdrs = (ehdr + eh.e_phoff as usize) as *const libc::Elf64_Phdr;
    let (mut bias, mut dynamic) = (None, None);
    for i in 0..usize::from(eh.e_phnum) {
        // SAFETY: the image's e_phnum program headers at e_phoff.
        let ph = unsafe { &*phdrs.add(i) };
        if ph.p_type == libc::PT_LOAD && bias.is_none() {
            bias = Some(
                ehdr.wrapping_add(ph.p_offset as usize)
                    .wrapping_sub(ph.p_vaddr as usize),
            );
        } else if ph.p_type == libc::PT_DYNAMIC {
            dynamic = Some(ph.p_vaddr as usize);
        }
    }
    let (Some(bias), Some(dynamic)) = (bias, dynamic) else {
        return null_mut();
    };
    // SAFETY: the vDSO's dynamic section and the tables it names are mapped with it; the
    // loader never relocates them (the image is read-only), so all are bias-relative.
    unsafe { lookup(bias.wrapping_add(dynamic) as *const Dyn, bias, name, true) }
}

/// Whether `p` lies in libfgpu.so itself (whose load bias the walk may not have matched:
/// its own definition must never be taken for the one behind it).
fn is_own(p: *mut c_void, own_base: usize) -> bool {
    let mut info = unsafe_zeroed();
    // SAFETY: dladdr with a valid out-struct.
    own_base != 0
        && unsafe { libc::dladdr(p, &mut info) } != 0
        && info.dli_fbase as usize == own_base
}

/// Looks `name` up in the object whose dynamic section is `dynamic`. `relative`: its
/// entries are offsets from `base` (otherwise they may already be relocated).
///
/// # Safety
/// `dynamic` is the mapped, DT_NULL-terminated dynamic section of an object loaded at
/// `base`.
unsafe fn lookup(dynamic: *const Dyn, base: usize, name: &CStr, relative: bool) -> *mut c_void {
    let (mut strtab, mut symtab, mut gnu, mut hash, mut versym) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut d = dynamic;
    loop {
        // SAFETY: within the dynamic section (caller contract), up to DT_NULL.
        let e = unsafe { &*d };
        // glibc relocates these entries in place; other loaders leave them relative.
        let addr = |v: u64| {
            if relative || (v as usize) < base {
                base.wrapping_add(v as usize)
            } else {
                v as usize
            }
        };
        match e.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = addr(e.val),
            DT_SYMTAB => symtab = addr(e.val),
            DT_GNU_HASH => gnu = addr(e.val),
            DT_HASH => hash = addr(e.val),
            DT_VERSYM => versym = addr(e.val),
            _ => {}
        }
        // SAFETY: the next entry exists (the section ends with DT_NULL).
        d = unsafe { d.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return null_mut();
    }
    let want = name.to_bytes();
    let matches = |i: usize| -> Option<*mut c_void> {
        // SAFETY: i indexes the symbol table (from the object's own hash table).
        let sym = unsafe { &*(symtab as *const Sym).add(i) };
        if sym.shndx == 0 || sym.info & 0xf != STT_FUNC || sym.value == 0 {
            return None;
        }
        // SAFETY: st_name is an offset into the string table.
        let n = unsafe { CStr::from_ptr((strtab + sym.name as usize) as *const c_char) };
        if n.to_bytes() != want {
            return None;
        }
        // SAFETY: the version table has one entry per symbol.
        if versym != 0 && unsafe { *(versym as *const u16).add(i) } & VERSYM_HIDDEN != 0 {
            return None;
        }
        Some(base.wrapping_add(sym.value as usize) as *mut c_void)
    };
    if gnu != 0 {
        let h = gnu_hash(want);
        let hdr = gnu as *const u32;
        // SAFETY: the GNU hash table's header, bloom filter, buckets and chains, laid out
        // as the ELF gABI extension defines them (64-bit bloom words).
        unsafe {
            let (nbuckets, symoffset, bloom_size) = (*hdr, *hdr.add(1), *hdr.add(2));
            if nbuckets == 0 {
                return null_mut();
            }
            let buckets = (hdr.add(4) as *const u64).add(bloom_size as usize) as *const u32;
            let chains = buckets.add(nbuckets as usize);
            let mut i = *buckets.add((h % nbuckets) as usize);
            if i < symoffset {
                return null_mut();
            }
            loop {
                let h2 = *chains.add((i - symoffset) as usize);
                if (h | 1) == (h2 | 1)
                    && let Some(p) = matches(i as usize)
                {
                    return p;
                }
                if h2 & 1 != 0 {
                    return null_mut();
                }
                i += 1;
            }
        }
    }
    if hash != 0 {
        // SAFETY: the SysV hash table: nbucket, nchain (= number of symbols), ...
        let nchain = unsafe { *(hash as *const u32).add(1) };
        return (0..nchain as usize).find_map(matches).unwrap_or(null_mut());
    }
    null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_glibcs_dlvsym_and_dlsym() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"a"), 5381 * 33 + 97);
        // The answer is the C library's own definition (this test binary, which defines
        // the shim's dlvsym, is skipped as the program).
        for name in [c"dlvsym", c"dlsym"] {
            let p = find_default(name);
            assert!(!p.is_null(), "{name:?} not found");
            let mut info = unsafe_zeroed();
            // SAFETY: dladdr with a valid out-struct.
            assert_ne!(unsafe { libc::dladdr(p, &mut info) }, 0);
            // SAFETY: dladdr filled both names.
            let (file, sym) = unsafe {
                (
                    CStr::from_ptr(info.dli_fname),
                    CStr::from_ptr(info.dli_sname),
                )
            };
            assert!(
                file.to_bytes()
                    .windows(4)
                    .any(|w| w == b"libc" || w == b"libd"),
                "{file:?}"
            );
            assert_eq!(sym, name);
        }
        assert!(find_default(c"no_such_symbol_anywhere").is_null());
    }

    #[test]
    fn finds_the_vdso_clock_and_it_agrees_with_libc() {
        let name = if cfg!(target_arch = "aarch64") {
            c"__kernel_clock_gettime"
        } else {
            c"__vdso_clock_gettime"
        };
        let p = vdso_function(name);
        assert!(!p.is_null(), "{name:?} not in the vDSO");
        assert!(vdso_function(c"no_such_symbol_anywhere").is_null());
        type ClockFn = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> c_int;
        // SAFETY: the vDSO's clock_gettime has clock_gettime's signature (vdso(7)).
        let f = unsafe { std::mem::transmute::<*mut c_void, ClockFn>(p) };
        let read = |via_vdso: bool| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid out-pointer.
            let r = unsafe {
                if via_vdso {
                    f(libc::CLOCK_MONOTONIC, &mut ts)
                } else {
                    libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts)
                }
            };
            assert_eq!(r, 0);
            ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
        };
        // The same clock: each reading lies between the other's neighbours.
        let (a, b, c) = (read(false), read(true), read(false));
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }
}
