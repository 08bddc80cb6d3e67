//! A test that cannot run here (no Redis to point at) says so at the
//! default verbosity: this runs one Redis-backed test of this binary
//! without `PATCHBAY_TEST_REDIS_URL`, as `cargo test` would, and reads
//! what it printed.

#[test]
fn a_redis_backed_test_without_redis_prints_why_it_skips() {
    let test = "drain::sigterm_runs_every_meter_final_flush_before_exit_even_with_slow_redis";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact"])
        .env_remove(crate::common::REDIS_ENV)
        .output()
        .expect("the test binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "the test was run: {stdout}");
    assert!(
        stderr.contains(&format!(
            "SKIPPED sigterm_runs_every_meter_final_flush: {} is not set",
            crate::common::REDIS_ENV
        )),
        "{stderr}"
    );
}
