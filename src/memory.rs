//! The daemon's heap, handed back to the kernel after a burst.
//!
//! glibc keeps freed small blocks in its arenas, and a burst of tens of
//! thousands of them (a listing of the whole history, the start's read
//! of every record) would leave an idle ptraind larger for good.

/// Hands freed heap pages back to the kernel.
pub fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free memory; it is thread-safe.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
