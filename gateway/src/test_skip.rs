//! How a unit test says it skips (no Redis to run against): on the
//! process's stderr itself, at the default verbosity. libtest captures a
//! passing test's `println!`/`eprintln!`, so a skip said that way was
//! seen only with `--nocapture`, and the test looked as if it had run.

use std::io::Write;

/// Prints `SKIPPED <test>: <why>` past libtest's capture.
pub fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}

/// The test Redis URL (`PATCHBAY_TEST_REDIS_URL`), or `None` after saying
/// why `test` skips.
pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var("PATCHBAY_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            skipped(test, "PATCHBAY_TEST_REDIS_URL is not set");
            None
        }
    }
}
