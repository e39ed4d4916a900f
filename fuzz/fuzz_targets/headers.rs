#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| courier_fuzz::headers(data));
