//! Every AgentService request's bytes: decoding, conversion, validation.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| subagentd::fuzzing::agent_request(data));
