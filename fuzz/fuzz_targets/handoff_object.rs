#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| courier_fuzz::handoff_object(data));
