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
/// (-1: kept; 0: returned at once), for every arena there is and for those
/// made later. A setting jemalloc refuses leaves the one before: only speed
/// depends on it.
#[cfg(target_os = "linux")]
fn set_decay(ms: isize) {
    for name in [c"arenas.dirty_decay_ms", c"arenas.muzzy_decay_ms"] {
        write_ssize(name, ms);
    }
    // (each arena by its index: "arena.<i>.*_decay_ms" does not take
    // MALLCTL_ARENAS_ALL; an index whose arena was never made is refused)
    for i in 0..arena_count() {
        for kind in ["dirty", "muzzy"] {
            if let Ok(name) = std::ffi::CString::new(format!("arena.{i}.{kind}_decay_ms")) {
                write_ssize(&name, ms);
            }
        }
    }
}

/// Writes the ssize_t mallctl `name`; a refusal is ignored.
#[cfg(target_os = "linux")]
fn write_ssize(name: &std::ffi::CStr, value: isize) {
    let mut value = value;
    // SAFETY: `name` is nul-terminated and names an ssize_t mallctl (the
    // callers' names only), `value` is one, valid for the call; nothing is
    // read back.
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

/// How many arena indexes there are (`arenas.narenas`), 0 if unknown.
#[cfg(target_os = "linux")]
fn arena_count() -> u32 {
    let (mut count, mut len) = (0u32, std::mem::size_of::<u32>());
    // SAFETY: "arenas.narenas" is an unsigned read into a value of that
    // size, `len` saying so.
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arenas.narenas".as_ptr(),
            (&raw mut count).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if status == 0 {
        count
    } else {
        0
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

    fn decay(name: &std::ffi::CStr) -> isize {
        let (mut value, mut len) = (0isize, std::mem::size_of::<isize>());
        // SAFETY: a read of an ssize_t mallctl into a value of that size.
        let status = unsafe {
            tikv_jemalloc_sys::mallctl(name.as_ptr(), (&raw mut value).cast(), &raw mut len, std::ptr::null_mut(), 0)
        };
        assert_eq!(status, 0, "{name:?}");
        value
    }

    #[test]
    fn pages_are_kept_while_any_conversion_runs() {
        // (a thread of its own makes an arena besides the first)
        std::thread::spawn(|| drop(vec![0u8; 1 << 20])).join().unwrap();
        assert!(arena_count() >= 1);
        let both =
            [c"arenas.dirty_decay_ms", c"arenas.muzzy_decay_ms", c"arena.0.dirty_decay_ms", c"arena.0.muzzy_decay_ms"];
        let first = KeepFreedPages::now();
        for name in both {
            assert_eq!(decay(name), -1, "{name:?}");
        }
        let second = KeepFreedPages::now();
        drop(first);
        assert_eq!(decay(c"arena.0.dirty_decay_ms"), -1, "another conversion still runs");
        drop(second);
        for name in both {
            assert_eq!(decay(name), 0, "{name:?}");
        }
    }
}
