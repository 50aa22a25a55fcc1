//! AWS shared credentials and config files (`~/.aws/credentials`,
//! `~/.aws/config`), which `object_store` does not read itself: keys and region
//! of the profile named by `AWS_PROFILE` (else `default`), used only when the
//! `AWS_*` variables do not give them.

use std::path::PathBuf;

use object_store::aws::AmazonS3Builder;

fn home_file(var: &str, name: &str) -> Option<PathBuf> {
    if let Ok(path) = std::env::var(var) {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws").join(name))
}

fn profile_name() -> String {
    std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string())
}

/// The `key = value` pairs of section `section` of an INI text.
pub(crate) fn section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    out
}

fn lookup(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// The profile's section in the config file (`[default]` or `[profile NAME]`).
fn config_section() -> Vec<(String, String)> {
    let name = profile_name();
    let Some(text) = home_file("AWS_CONFIG_FILE", "config").and_then(|p| std::fs::read_to_string(p).ok()) else {
        return Vec::new();
    };
    let header = if name == "default" { name } else { format!("profile {name}") };
    section(&text, &header)
}

/// The profile's region, if the config file names one.
pub(crate) fn region() -> Option<String> {
    lookup(&config_section(), "region")
}

/// Adds the profile's keys to `builder` when the environment has none.
pub(crate) fn apply(builder: AmazonS3Builder) -> AmazonS3Builder {
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        return builder;
    }
    let name = profile_name();
    let mut pairs = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|text| section(&text, &name))
        .unwrap_or_default();
    pairs.extend(config_section());
    let (Some(id), Some(secret)) = (lookup(&pairs, "aws_access_key_id"), lookup(&pairs, "aws_secret_access_key"))
    else {
        return builder;
    };
    let builder = builder.with_access_key_id(id).with_secret_access_key(secret);
    match lookup(&pairs, "aws_session_token") {
        Some(token) => builder.with_token(token),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_section() {
        let text = "[default]\naws_access_key_id = A\n# note\n[profile lab]\nregion=eu-west-1\n[other]\nregion = x\n";
        assert_eq!(section(text, "default"), vec![("aws_access_key_id".to_string(), "A".to_string())]);
        assert_eq!(section(text, "profile lab"), vec![("region".to_string(), "eu-west-1".to_string())]);
        assert!(section(text, "missing").is_empty());
    }
}
