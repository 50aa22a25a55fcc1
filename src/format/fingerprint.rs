//! The obs fingerprint of decisions.md 20: the first 24 hex digits of the SHA-256
//! of what Python's `json.dumps(obj, sort_keys=True)` prints for
//! `{"schema": <schema.json text>, "tile_cells": [...], "shards": [<sha256>...]}`.

use sha2::{Digest, Sha256};

/// Appends `s` as a JSON string the way Python's `json.dumps` (ensure_ascii=True)
/// prints it: the short escapes for `"` `\` and the five named control
/// characters, `\u00XX` for other control characters, and `\uXXXX` (lowercase,
/// surrogate pairs above U+FFFF) for everything outside ASCII.
pub fn push_python_json_string(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The exact text that is hashed.
pub fn canonical_text(schema_text: &str, tile_cells: &[u64], shard_sha256: &[String]) -> String {
    let mut out = String::from("{\"schema\": ");
    push_python_json_string(&mut out, schema_text);
    out.push_str(", \"shards\": [");
    for (i, sha) in shard_sha256.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_python_json_string(&mut out, sha);
    }
    out.push_str("], \"tile_cells\": [");
    for (i, cells) in tile_cells.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&cells.to_string());
    }
    out.push_str("]}");
    out
}

/// The obs fingerprint: 24 lowercase hex digits.
pub fn obs_fingerprint(schema_text: &str, tile_cells: &[u64], shard_sha256: &[String]) -> String {
    let digest = Sha256::digest(canonical_text(schema_text, tile_cells, shard_sha256).as_bytes());
    hex::encode(digest)[..24].to_string()
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_as_python_does() {
        let mut out = String::new();
        // json.dumps('a"b\\c\n\x01\x7fé€😀') ==
        // '"a\\"b\\\\c\\n\\u0001\\u007f\\u00e9\\u20ac\\ud83d\\ude00"'
        push_python_json_string(&mut out, "a\"b\\c\n\u{1}\u{7f}é€😀");
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\u0001\\u007f\\u00e9\\u20ac\\ud83d\\ude00\"");
    }

    #[test]
    fn canonical_text_has_sorted_keys_and_python_separators() {
        let text = canonical_text("{\n  \"x\": 1\n}", &[4, 2], &["ab".into(), "cd".into()]);
        assert_eq!(text, r#"{"schema": "{\n  \"x\": 1\n}", "shards": ["ab", "cd"], "tile_cells": [4, 2]}"#);
        assert_eq!(canonical_text("", &[], &[]), r#"{"schema": "", "shards": [], "tile_cells": []}"#);
    }
}
