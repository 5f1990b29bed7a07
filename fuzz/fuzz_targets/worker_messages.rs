//! A worker session's messages and Agent records: decoding and conversion.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| subagentd::fuzzing::worker_message(data));
