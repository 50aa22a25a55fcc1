//! A store that does not serve a request says so: a refused connection, a
//! 404 and a 403 each get their own message, naming the URL and what to
//! check, for inputs at URLs of every format and for datasets in buckets;
//! never "cannot open as HDF5". Exit status 2, and no output left.

use crate::secrets::unused_port;
use crate::servers::Server;
use crate::util::TestDir;

const S3_ENV: [(&str, &str); 3] =
    [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_REGION", "us-east-1")];

/// The one-line message of a run that failed with status 2, and that it is
/// not a format's complaint.
#[track_caller]
fn refusal(t: &TestDir, args: &[&str], env: &[(&str, &str)]) -> String {
    let run = t.run_env(args, env).expect_code(2);
    let err = run.stderr();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("cannot open as"), "a store's failure is not the format's: {err}");
    err
}

#[test]
fn a_refused_connection_names_the_url_and_the_address_to_check() {
    let t = TestDir::new();
    let port = unused_port();
    let url = format!("http://127.0.0.1:{port}/x.h5ad");
    let dead = format!("http://127.0.0.1:{port}");
    // An input at a URL, and a dataset in a bucket, read and written, at
    // once (each waits out the retries).
    let (input, (dataset, output)) = std::thread::scope(|s| {
        let input = s.spawn(|| refusal(&t, &["convert", &url, "out"], &[]));
        let dataset = s.spawn(|| refusal(&t, &["info", "s3://test/ds", "--endpoint", &dead], &S3_ENV));
        let output = refusal(&t, &["convert", "--endpoint", &dead, &url, "s3://test/new"], &S3_ENV);
        (input.join().unwrap(), (dataset.join().unwrap(), output))
    });
    let refused = format!("connection refused by 127.0.0.1:{port}: nothing is listening there; check");
    assert!(input.contains(&format!("{url}: {refused} the URL's host and port")), "{input}");
    assert!(
        dataset.contains(&format!("s3://test/ds/manifest.json: {refused} the endpoint (--endpoint, AWS_ENDPOINT_URL)")),
        "{dataset}"
    );
    assert!(output.contains(&refused), "{output}");
    assert!(!t.join("out").exists(), "nothing written");
}

#[test]
fn a_404_and_a_403_from_a_store_name_the_url_and_what_to_check() {
    let t = TestDir::new();
    let example = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/pbmc_1k.h5ad");
    std::fs::create_dir_all(t.join("forbidden")).unwrap();
    std::fs::copy(&example, t.join("forbidden/pbmc_1k.h5ad")).unwrap();
    let root = t.path().display().to_string();
    let Some(http) = Server::start("http", &[&root]) else { return };
    let base = http.url();

    // An input of each format that reads through the store, then a dataset.
    for (path, format) in
        [("nothing.h5ad", "h5ad"), ("nothing.h5", "10x-h5"), ("matrix.mtx", "mtx"), ("x.zarr", "zarr")]
    {
        let url = format!("{base}/{path}");
        let err = refusal(&t, &["convert", "--input-format", format, &url, "out"], &[]);
        assert!(err.contains(&format!("{url}: not found (HTTP 404): check the URL's path")), "{format}: {err}");
        let url = format!("{base}/forbidden/{path}");
        let err = refusal(&t, &["convert", "--input-format", format, &url, "out"], &[]);
        // (a zarr store names the object of it that was refused: zarr.json)
        let denied = ": access denied (HTTP 403): check the URL's credentials";
        assert!(err.contains(&url) && err.contains(denied), "{format}: {err}");
    }
    let err = refusal(&t, &["info", &format!("{base}/forbidden/ds")], &[]);
    assert!(err.contains(&format!("{base}/forbidden/ds/manifest.json: access denied (HTTP 403)")), "{err}");
    assert!(!t.join("out").exists(), "nothing written");

    // In a bucket: an input that is not there, and a bucket that is not.
    let Some(s3) = Server::start("s3", &[]) else { return };
    let endpoint = s3.url();
    let args = ["convert", "--endpoint", &endpoint, "s3://test/missing.h5ad", "out"];
    let err = refusal(&t, &args, &S3_ENV);
    assert!(
        err.contains("s3://test/missing.h5ad: not found (HTTP 404): check the bucket's name and the path"),
        "{err}"
    );
    let err = refusal(&t, &["verify", "s3://no-such-bucket/ds", "--endpoint", &endpoint], &S3_ENV);
    assert!(err.contains("s3://no-such-bucket/ds"), "{err}");
}
