//! The object-store servers of tests/servers/serve.py (moto's S3 server,
//! the GCS emulators, a static HTTP server with Range support and faults),
//! started on 127.0.0.1 under $DELTACELLS_PYTHON for the tests that need
//! one, and stopped when the test ends.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process; killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Server {
    /// `serve.py KIND ARGS...`, once it accepts connections; None (a skip)
    /// where $DELTACELLS_PYTHON is not set.
    pub fn start(kind: &str, args: &[&str]) -> Option<Server> {
        let Some(python) = std::env::var_os("DELTACELLS_PYTHON") else {
            crate::util::skip(&format!("DELTACELLS_PYTHON not set; {kind} server tests skipped"));
            return None;
        };
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/servers/serve.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(kind)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the test server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).expect("server output");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{kind} server did not start: {line:?}"));
        Some(Server { child, port })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Closing stdin lets serve.py stop what it started; then make sure.
        drop(self.child.stdin.take());
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
