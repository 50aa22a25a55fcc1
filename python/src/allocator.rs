//! How long the extension's allocator (jemalloc, on Linux) keeps the pages
//! its callers free.
//!
//! The extension returns freed pages to the system at once (lib.rs), so
//! that a loader's memory is what it holds. A conversion is the opposite
//! case: it frees and allocates blocks of tens of megabytes for every tile,
//! and returning them at once made each block's pages fault in afresh
//! (`deltacells convert` from the console script ran 1.5-1.6x the
//! binary's time on 100,000 atlas cells, most of the difference system
//! time). [`KeepFreedPages`] keeps them for as long as a conversion runs.

use std::sync::Mutex;

/// Conversions running in this process: freed pages are kept while there
/// is one.
static RUNNING: Mutex<usize> = Mutex::new(0);

/// While one is alive, jemalloc keeps freed pages for reuse; when the last
/// is dropped, they go back to the system.
pub(crate) struct KeepFreedPages(());

impl KeepFreedPages {
    pub(crate) fn now() -> KeepFreedPages {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if *running == 0 {
            set_decay(-1);
        }
        *running += 1;
        KeepFreedPages(())
    }
}

impl Drop for KeepFreedPages {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        *running = running.saturating_sub(1);
        if *running == 0 {
            set_decay(0);
            purge();
        }
    }
}

/// Sets how many milliseconds freed pages stay before they are returned
/// (-1: kept; 0: returned at once), for every arena and for those made
/// later. A setting jemalloc refuses leaves the one before: only speed
/// depends on it.
#[cfg(target_os = "linux")]
fn set_decay(ms: isize) {
    for name in [
        c"arenas.dirty_decay_ms",
        c"arenas.muzzy_decay_ms",
        // (4096 is MALLCTL_ARENAS_ALL: every arena there is)
        c"arena.4096.dirty_decay_ms",
        c"arena.4096.muzzy_decay_ms",
    ] {
        let mut value = ms;
        // SAFETY: each name is a nul-terminated mallctl of type ssize_t, and
        // `value` is one, valid for the call; nothing is read back.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                (&raw mut value).cast(),
                std::mem::size_of::<isize>(),
            );
        }
    }
}

/// Returns every arena's freed pages to the system now.
#[cfg(target_os = "linux")]
fn purge() {
    // SAFETY: "arena.4096.purge" takes and gives nothing; the name is
    // nul-terminated.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn set_decay(_ms: isize) {}

#[cfg(not(target_os = "linux"))]
fn purge() {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn decay() -> isize {
        let (mut value, mut len) = (0isize, std::mem::size_of::<isize>());
        // SAFETY: a read of an ssize_t mallctl into a value of that size.
        let status = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"arenas.dirty_decay_ms".as_ptr(),
                (&raw mut value).cast(),
                &raw mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(status, 0);
        value
    }

    #[test]
    fn pages_are_kept_while_any_conversion_runs() {
        let first = KeepFreedPages::now();
        assert_eq!(decay(), -1);
        let second = KeepFreedPages::now();
        drop(first);
        assert_eq!(decay(), -1, "another conversion still runs");
        drop(second);
        assert_eq!(decay(), 0);
    }
}
