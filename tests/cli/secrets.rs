//! No credential reaches any output: canary values are put in every place
//! credentials come from (the AWS variables, an AWS profile's files, a URL's
//! userinfo, a pre-signed URL's query), succeeding and failing commands run
//! with them against the real servers (moto's S3 server, the static HTTP
//! server), and no canary may appear in what any of them prints, nor in the
//! datasets they write.

use std::path::PathBuf;

use crate::servers::Server;
use crate::util::{Run, TestDir};

/// The AWS variables' canaries (moto accepts any key).
const ENV: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "AKIACANARYENV0000001"),
    ("AWS_SECRET_ACCESS_KEY", "canary-env-secret-0000002"),
    ("AWS_SESSION_TOKEN", "canary-env-session-0000003"),
];
/// The profile's canaries, in its credentials file.
const PROFILE: [&str; 3] = ["AKIACANARYPROFILE004", "canary-profile-secret-05", "canary-profile-token-06"];
/// A URL's userinfo.
const USER: &str = "canaryuser07";
const PASSWORD: &str = "canarypass08";
/// A pre-signed query string's secrets (S3's, GCS's and generic ones).
const QUERY_SECRETS: [&str; 7] = [
    "AKIACANARYQUERY00009",
    "canary-query-token-10",
    "canaryquerysig11",
    "canarygoogsig12",
    "canarysig13",
    "canarytoken14",
    "canarykey15",
];

fn canaries() -> Vec<&'static str> {
    let mut all: Vec<&str> = ENV.iter().map(|(_, v)| *v).collect();
    all.extend(PROFILE);
    all.extend([USER, PASSWORD]);
    all.extend(QUERY_SECRETS);
    all
}

/// The query of a pre-signed URL, every value of which is a canary but for
/// the harmless ones.
fn signed_query() -> String {
    let q = QUERY_SECRETS;
    format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}%2F20260101%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-Security-Token={}&X-Amz-SignedHeaders=host\
         &X-Amz-Signature={}&X-Goog-Signature={}&sig={}&token={}&key={}",
        q[0], q[1], q[2], q[3], q[4], q[5], q[6]
    )
}

/// Where a command finds its credentials.
enum Credentials<'a> {
    /// The AWS variables.
    Env,
    /// An AWS profile's files, and no AWS variable.
    Profile(&'a TestDir),
    /// None of either (the URL carries its own).
    None,
}

const AWS_VARS: [&str; 7] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_ENDPOINT_URL",
];

fn run(t: &TestDir, credentials: Credentials, args: &[&str]) -> Run {
    let mut command = t.command(args);
    for var in AWS_VARS {
        command.env_remove(var);
    }
    command.env("AWS_REGION", "us-east-1");
    match credentials {
        Credentials::Env => {
            command.envs(ENV);
        }
        Credentials::Profile(dir) => {
            command
                .env("AWS_PROFILE", "canary")
                .env("AWS_SHARED_CREDENTIALS_FILE", dir.join("aws/credentials"))
                .env("AWS_CONFIG_FILE", dir.join("aws/config"));
        }
        Credentials::None => {}
    }
    let output = command.output().expect("run deltacells");
    Run { cmd: format!("deltacells {}", args.join(" ")), output, listing: String::new() }
}

/// Asserts that no canary is in `run`'s output, and returns its stderr.
#[track_caller]
fn clean(run: &Run) -> String {
    let (out, err) = (run.stdout(), run.stderr());
    for canary in canaries() {
        assert!(
            !out.contains(canary) && !err.contains(canary),
            "{canary} printed by {}\n--- stdout\n{out}\n--- stderr\n{err}",
            run.cmd
        );
    }
    err
}

fn write_profile(t: &TestDir) {
    std::fs::create_dir_all(t.join("aws")).unwrap();
    let [id, secret, token] = PROFILE;
    let credentials =
        format!("[canary]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\naws_session_token = {token}\n");
    std::fs::write(t.join("aws/credentials"), credentials).unwrap();
    std::fs::write(t.join("aws/config"), "[profile canary]\nregion = us-east-1\n").unwrap();
}

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/pbmc_1k.h5ad")
}

/// A port on 127.0.0.1 that nothing listens on (it was free a moment ago).
pub fn unused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("its address").port()
}

#[test]
fn no_credential_reaches_any_output_of_a_command() {
    let Some(s3) = Server::start("s3", &[]) else { return };
    let t = TestDir::new();
    std::fs::copy(example(), t.join("pbmc_1k.h5ad")).unwrap();
    let layout = ["--tile-size", "300", "--level", "3"];
    t.run(&[&["convert", "-q"][..], &layout, &["pbmc_1k.h5ad", "local"]].concat()).expect_code(0);
    let root = t.path().display().to_string();
    let Some(http) = Server::start("http", &[&root]) else { return };
    write_profile(&t);
    let endpoint = s3.url();
    let at = |path: &str| format!("http://{USER}:{PASSWORD}@127.0.0.1:{}/{path}", http.port);
    let signed = |path: &str| format!("{}?{}", at(path), signed_query());
    let dead = format!("http://{USER}:{PASSWORD}@127.0.0.1:{}/pbmc_1k.h5ad?{}", unused_port(), signed_query());
    let e = endpoint.as_str();
    let mut stderr = String::new();

    // Succeeding commands: a dataset in S3 written and read with the
    // variables' keys, read with the profile's, and one converted from a URL
    // with userinfo; every --stats, --json and text output.
    use Credentials::{Env, None as Nothing, Profile};
    let convert = [&["convert", "--stats", "--endpoint", e][..], &layout, &["pbmc_1k.h5ad", "s3://test/ds"]].concat();
    clean(&run(&t, Env, &convert).expect_code(0));
    for args in [
        &["info", "--stats", "s3://test/ds", "--endpoint", e][..],
        &["info", "--json", "--stats", "s3://test/ds", "--endpoint", e],
        &["verify", "--stats", "s3://test/ds", "--endpoint", e],
        &["verify", "--json", "--stats", "s3://test/ds", "--endpoint", e],
        &["obs", "info", "s3://test/ds", "--endpoint", e, "--cache-dir", "c"],
    ] {
        clean(&run(&t, Env, args).expect_code(0));
        clean(&run(&t, Profile(&t), args).expect_code(0));
    }
    let from_url = at("pbmc_1k.h5ad");
    for args in [
        &["convert", "--stats", "--tile-size", "300", &from_url, "from_url"][..],
        &["convert", "--json", "--stats", "--download-inputs", "--tile-size", "300", &from_url, "downloaded"],
        &["info", "--stats", &at("local")],
        &["verify", "--json", "--stats", &at("local")],
    ] {
        clean(&run(&t, Nothing, args).expect_code(0));
    }
    for written in ["from_url", "downloaded"] {
        let manifest = std::fs::read_to_string(t.join(written).join("manifest.json")).unwrap();
        assert!(manifest.contains(&format!("http://REDACTED@127.0.0.1:{}/pbmc_1k.h5ad", http.port)), "{manifest}");
        assert!(canaries().iter().all(|c| !manifest.contains(c)), "{manifest}");
    }
    let appended = ["append", "--json", "--stats", "--endpoint", e, "s3://test/ds", &from_url];
    let out = run(&t, Env, &appended).expect_code(0);
    clean(&out);
    assert!(out.stdout().contains("REDACTED@127.0.0.1"), "the summary names its input: {}", out.stdout());

    // Failing commands: a pre-signed URL the server does not have, the same
    // downloaded, an append of it, a refused connection, a 403, a bucket
    // that does not exist, a store at a dead endpoint.
    let dead_endpoint = format!("http://127.0.0.1:{}", unused_port());
    let forbidden = signed("forbidden/pbmc_1k.h5ad");
    let presigned = signed("nothing.h5ad");
    let failing: [(Credentials, Vec<&str>); 9] = [
        (Nothing, vec!["convert", "--stats", &presigned, "out1"]),
        (Nothing, vec!["convert", "--download-inputs", "--stats", &presigned, "out2"]),
        (Env, vec!["append", "--stats", "--endpoint", e, "s3://test/ds", &presigned]),
        (Nothing, vec!["convert", "--stats", &dead, "out3"]),
        (Nothing, vec!["convert", "--stats", &forbidden, "out4"]),
        (Nothing, vec!["info", "--stats", &forbidden]),
        (Env, vec!["info", "s3://missing-bucket/ds", "--endpoint", e]),
        (Profile(&t), vec!["verify", "--stats", "s3://test/ds", "--endpoint", &dead_endpoint]),
        (Env, vec!["convert", "--endpoint", &dead_endpoint, "pbmc_1k.h5ad", "s3://test/other"]),
    ];
    for (credentials, args) in failing {
        stderr.push_str(&clean(&run(&t, credentials, &args).expect_code(2)));
    }
    // The messages still name what failed, redacted.
    assert!(stderr.contains(&format!("http://REDACTED@127.0.0.1:{}/nothing.h5ad?", http.port)), "{stderr}");
    assert!(stderr.contains("&X-Amz-Signature=REDACTED&"), "{stderr}");
    assert!(stderr.contains("X-Amz-Date=20260101T000000Z"), "harmless parameters are kept: {stderr}");
}
