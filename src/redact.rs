//! Credentials kept out of every text the library makes: the one place that
//! decides what of a URL may be shown.
//!
//! A URL can carry a secret in two places: its userinfo
//! (`https://user:password@host/x.h5ad`, as some data portals hand out) and
//! its query (a pre-signed S3 URL's `X-Amz-Signature`, `X-Amz-Credential`
//! and `X-Amz-Security-Token`, GCS's `X-Goog-Signature`, Azure's `sig`, a
//! portal's `token=` or `key=`). [`redact`] replaces both with `REDACTED`
//! wherever they appear in a text, so that it can be given a URL, a message
//! that quotes one (object_store's and reqwest's errors print the URL they
//! requested, percent-encoded or not), or a whole error chain. [`Redacted`]
//! is the same as a `Display` wrapper, for the places that format a URL.
//!
//! Storage locations are redacted when they are made
//! ([`crate::storage::ObjectStorage`] keeps only the redacted form for its
//! messages), [`crate::error_chain`] redacts the chain it prints, and the
//! command line and the Python binding redact every error before it leaves
//! them; keys read from the environment or a profile file are never put into
//! a text at all. What is not redacted: the URL itself, which is still used,
//! whole, to make the requests.

use std::borrow::Cow;
use std::fmt;

/// What replaces a secret.
pub const MASK: &str = "REDACTED";

/// `text` with every URL userinfo and every credential-carrying query
/// parameter's value replaced by [`MASK`]; borrowed when there is none.
///
/// ```
/// use deltacells::redact::redact;
/// assert_eq!(redact("https://ann:pw@host/x.h5ad"), "https://REDACTED@host/x.h5ad");
/// assert_eq!(redact("GET s3/x?X-Amz-Signature=ab12&part=2"), "GET s3/x?X-Amz-Signature=REDACTED&part=2");
/// assert_eq!(redact("out/pbmc_1k"), "out/pbmc_1k");
/// ```
pub fn redact(text: &str) -> Cow<'_, str> {
    if !text.contains('@') && !text.contains('=') && !text.contains("%3D") && !text.contains("%3d") {
        return Cow::Borrowed(text);
    }
    let mut masked: Vec<std::ops::Range<usize>> = userinfo_spans(text);
    masked.extend(secret_value_spans(text));
    if masked.is_empty() {
        return Cow::Borrowed(text);
    }
    masked.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in masked {
        if span.start < at {
            // Overlapping spans (a secret value inside userinfo): already masked.
            at = at.max(span.end);
            continue;
        }
        out.push_str(&text[at..span.start]);
        out.push_str(MASK);
        at = span.end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

/// A URL, a path or a message, displayed with its secrets [`redact`]ed.
#[derive(Clone, Copy, Debug)]
pub struct Redacted<'a>(pub &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(self.0))
    }
}

/// A path (an input that may be a URL) as text, [`redact`]ed.
pub fn path(path: &std::path::Path) -> String {
    redact(&path.to_string_lossy()).into_owned()
}

/// Serializes paths (inputs that may be URLs) [`redact`]ed: for the
/// summaries a command prints.
pub fn serialize_paths<S: serde::Serializer>(paths: &[std::path::PathBuf], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(paths.iter().map(|p| path(p)))
}

/// Characters that end a URL in running text (and so a secret in it): space,
/// quotes and the brackets a message puts around a URL.
fn ends_url(c: u8) -> bool {
    c.is_ascii_whitespace() || matches!(c, b'"' | b'\'' | b'`' | b'<' | b'>' | b'(' | b')' | b'[' | b']' | b'{' | b'}')
}

/// The userinfo of every `scheme://userinfo@host` in `text` (WHATWG: the
/// authority ends at the first `/`, `?`, `#` or `\`; userinfo runs to its
/// last `@`).
fn userinfo_spans(text: &str) -> Vec<std::ops::Range<usize>> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("://") {
        let start = from + found + 3;
        let end = bytes[start..]
            .iter()
            .position(|&c| matches!(c, b'/' | b'?' | b'#' | b'\\') || ends_url(c))
            .map_or(bytes.len(), |n| start + n);
        if let Some(at) = text[start..end].rfind('@') {
            spans.push(start..start + at);
        }
        from = end.max(start);
    }
    spans
}

/// Whether a query parameter of this name carries a credential. Broad on
/// purpose: hiding a harmless value costs a little clarity, showing a
/// signature costs the data.
fn is_secret_name(name: &str) -> bool {
    const PARTS: [&str; 12] = [
        "sig",
        "token",
        "key",
        "credential",
        "secret",
        "password",
        "passwd",
        "pwd",
        "auth",
        "session",
        "security",
        "code",
    ];
    let name = name.to_ascii_lowercase();
    PARTS.iter().any(|p| name.contains(p))
}

/// How long a query separator (`?`, `&`, `;` or their percent-encoded forms)
/// starting at `i` is, if one does.
fn separator_at(bytes: &[u8], i: usize) -> Option<usize> {
    match bytes[i] {
        b'?' | b'&' | b';' => Some(1),
        b'%' if bytes.len() >= i + 3 => {
            let code = [bytes[i + 1].to_ascii_uppercase(), bytes[i + 2].to_ascii_uppercase()];
            matches!(&code, b"3F" | b"26" | b"3B").then_some(3)
        }
        _ => None,
    }
}

/// How long an `=` (or `%3D`) starting at `i` is, if one does.
fn equals_at(bytes: &[u8], i: usize) -> Option<usize> {
    match bytes[i] {
        b'=' => Some(1),
        b'%' if bytes.len() >= i + 3 && bytes[i + 1] == b'3' && bytes[i + 2].eq_ignore_ascii_case(&b'D') => Some(3),
        _ => None,
    }
}

/// The value of every `?name=value` or `&name=value` (plain or
/// percent-encoded, in a URL or anywhere else in `text`) whose name
/// [`is_secret_name`].
fn secret_value_spans(text: &str) -> Vec<std::ops::Range<usize>> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let Some(sep) = separator_at(bytes, i) else {
            i += 1;
            continue;
        };
        let name_start = i + sep;
        let name_len = bytes[name_start..]
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
            .unwrap_or(bytes.len() - name_start);
        let name_end = name_start + name_len;
        let Some(eq) = (name_len > 0 && name_end < bytes.len()).then(|| equals_at(bytes, name_end)).flatten() else {
            i = name_start;
            continue;
        };
        let value_start = name_end + eq;
        let mut value_end = value_start;
        while value_end < bytes.len()
            && !ends_url(bytes[value_end])
            && !matches!(bytes[value_end], b'#' | b',')
            && separator_at(bytes, value_end).is_none()
        {
            value_end += 1;
        }
        if value_end > value_start && is_secret_name(&text[name_start..name_end]) {
            spans.push(value_start..value_end);
        }
        i = value_end;
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_masked_and_the_rest_kept() {
        assert_eq!(redact("https://user:pass@example.org/x.h5ad"), "https://REDACTED@example.org/x.h5ad");
        assert_eq!(redact("https://token@example.org"), "https://REDACTED@example.org");
        // the last @ of the authority ends the userinfo; an @ in the path is not one
        assert_eq!(redact("http://a:p@ss@h:9/a@b"), "http://REDACTED@h:9/a@b");
        assert_eq!(redact("s3://bucket/a@b/x.h5ad"), "s3://bucket/a@b/x.h5ad");
        assert_eq!(
            redact("error sending request for url (https://u:p@h/x.h5ad): refused"),
            "error sending request for url (https://REDACTED@h/x.h5ad): refused"
        );
        assert_eq!(redact("two: http://a:b@x/ and ftp://c:d@y"), "two: http://REDACTED@x/ and ftp://REDACTED@y");
        assert!(matches!(redact("user@example.org wrote"), Cow::Borrowed(_)));
    }

    #[test]
    fn signed_query_values_are_masked() {
        let url = "https://b.s3.amazonaws.com/x.h5ad?X-Amz-Algorithm=AWS4-HMAC-SHA256\
                   &X-Amz-Credential=AKIA%2F20260101%2Fus-east-1&X-Amz-Date=20260101T000000Z\
                   &X-Amz-Expires=3600&X-Amz-Security-Token=tok%2Bx&X-Amz-Signature=abc123";
        assert_eq!(
            redact(url),
            "https://b.s3.amazonaws.com/x.h5ad?X-Amz-Algorithm=AWS4-HMAC-SHA256\
             &X-Amz-Credential=REDACTED&X-Amz-Date=20260101T000000Z\
             &X-Amz-Expires=3600&X-Amz-Security-Token=REDACTED&X-Amz-Signature=REDACTED"
        );
        assert_eq!(redact("h/x?X-Goog-Signature=ff&generation=3"), "h/x?X-Goog-Signature=REDACTED&generation=3");
        assert_eq!(redact("h/x?sv=1&sig=a%2Bb%3D#part"), "h/x?sv=1&sig=REDACTED#part");
        assert_eq!(redact("h/x?token=t;key=k"), "h/x?token=REDACTED;key=REDACTED");
        assert_eq!(redact("h/x?api_key=k1&access_token=t1"), "h/x?api_key=REDACTED&access_token=REDACTED");
        // the value ends where the URL does in running text
        assert_eq!(redact("GET (h/x?sig=abc) failed"), "GET (h/x?sig=REDACTED) failed");
    }

    #[test]
    fn percent_encoded_queries_are_masked_too() {
        // object_store percent-encodes a `?` that ends up in an object's name
        assert_eq!(
            redact("GET http://h/x.h5ad%3FX-Amz-Signature%3Dabc%26X-Amz-Date%3D1 in 1ms"),
            "GET http://h/x.h5ad%3FX-Amz-Signature%3DREDACTED%26X-Amz-Date%3D1 in 1ms"
        );
    }

    #[test]
    fn text_without_secrets_is_left_alone() {
        for text in ["out/pbmc_1k", "s3://lab/atlas", "a=b c=d", "X/data[3]: value 2.5", "?=x", "&&=", "%3", "a%3"] {
            assert_eq!(redact(text), text);
        }
        assert_eq!(redact("--metadata key=value"), "--metadata key=value", "not a query: no ? or & before it");
    }

    #[test]
    fn display_wrapper_and_paths() {
        assert_eq!(Redacted("https://u:p@h/x?sig=1").to_string(), "https://REDACTED@h/x?sig=REDACTED");
        assert_eq!(path(std::path::Path::new("https://u:p@h/x.h5ad")), "https://REDACTED@h/x.h5ad");
    }
}
