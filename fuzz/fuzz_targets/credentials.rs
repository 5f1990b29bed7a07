//! authorization and subagentd-tenant headers: only the one key passes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| subagentd::fuzzing::credential(data));
