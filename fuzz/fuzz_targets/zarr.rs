//! Any bytes, as the objects of an AnnData zarr store (metadata JSON of v2
//! and v3, chunks raw or compressed with zstd or gzip by the harness),
//! written to a folder and read as a conversion reads it: an error naming
//! the store, or rows of the declared shape; never a panic, never an
//! allocation sized by a length field or by what a codec's header claims.
//!
//! zarrs 0.23 panics on some malformed v2 string chunks; the reader catches
//! that panic as the chunk's error. libfuzzer-sys's panic hook aborts before
//! anything can catch, so the target puts back the default hook: a panic
//! the reader does not catch still ends the run in libfuzzer-sys, a crash.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static DEFAULT_HOOK: std::sync::Once = std::sync::Once::new();
    DEFAULT_HOOK.call_once(|| drop(std::panic::take_hook()));
    let _ = deltacells::inputs::fuzzing::zarr(data);
});
