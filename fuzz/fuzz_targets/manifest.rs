//! The manifest parser and its consistency checks never panic; an accepted
//! manifest serializes and parses back to itself.
#![no_main]
use deltacells::format::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::parse_checked(data) {
        let again = Manifest::parse_checked(m.to_json().as_bytes()).expect("our own output parses");
        assert_eq!(again, m);
    }
});
