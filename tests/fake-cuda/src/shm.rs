//! The fake's shared state files: each table of `$FAKE_CUDA_STATE` is one file mapped
//! shared by every process that names it.

/// `path` mapped shared and read-write, created (mode 0666, so that every UID of the node
/// can use one fake GPU) and grown to `size` bytes as needed; growing zero-fills, which is
/// every table's empty state. `None` when the file cannot be opened, grown or mapped. The
/// mapping is never unmapped and outlives the descriptor.
pub fn map_shared(path: &str, size: usize) -> Option<*mut u8> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: c is a valid C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is ours; a concurrent ftruncate by another process to the same size is
    // harmless; the mapping stays valid after the descriptor is closed.
    let m = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let ok = libc::fstat(fd, &mut st) == 0
            && ((st.st_size as usize) >= size || libc::ftruncate(fd, size as libc::off_t) == 0);
        let m = if ok {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        m
    };
    (m != libc::MAP_FAILED).then_some(m as *mut u8)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_mappings_of_one_file_share_their_bytes_and_the_file_grows_once() {
        let dir = std::env::temp_dir().join(format!("fgpu-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t");
        let p = p.to_str().unwrap();
        let a = super::map_shared(p, 8192).unwrap();
        let b = super::map_shared(p, 4096).unwrap();
        // SAFETY: both point to live mappings of at least 4096 bytes.
        unsafe {
            assert_eq!(*b.add(100), 0, "a new file is zero-filled");
            *a.add(100) = 7;
            assert_eq!(*b.add(100), 7);
        }
        assert_eq!(std::fs::metadata(p).unwrap().len(), 8192, "never shrunk");
        assert!(super::map_shared("/nonexistent-dir/x", 4096).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
