#![no_main]
use std::sync::OnceLock;

/// One folder per fuzzing process, reused by every input: the segment is
/// overwritten each time, and the folder goes when the process ends.
static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("tempdir"));
    courier_fuzz::intake_log(dir.path(), data);
});
