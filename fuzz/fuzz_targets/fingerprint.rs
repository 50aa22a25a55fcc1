//! The Python-compatible JSON of the fingerprint: any string escapes to pure
//! ASCII JSON that parses back to the same string, and the canonical text of
//! any schema text, tile list and shard hashes is valid JSON of that object.
#![no_main]
use deltacells::format::fingerprint::{canonical_text, obs_fingerprint, push_python_json_string};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let mut out = String::new();
    push_python_json_string(&mut out, &text);
    assert!(out.is_ascii());
    assert_eq!(serde_json::from_str::<String>(&out).unwrap(), text);
    let cells: Vec<u64> = data.iter().map(|&b| u64::from(b) * 1000).collect();
    let shards = vec![text.clone()];
    let canonical = canonical_text(&text, &cells, &shards);
    let v: serde_json::Value = serde_json::from_str(&canonical).unwrap();
    assert_eq!(v["schema"], serde_json::Value::String(text.clone()));
    assert_eq!(obs_fingerprint(&text, &cells, &shards).len(), 24);
});
