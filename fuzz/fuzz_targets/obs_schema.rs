//! The obs schema parser never panics on any bytes.
#![no_main]
use deltacells::format::obs_schema::ObsSchema;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(schema) = ObsSchema::parse(data) {
        let text = serde_json::to_string(&schema).unwrap();
        assert_eq!(ObsSchema::parse(text.as_bytes()).unwrap(), schema);
    }
});
