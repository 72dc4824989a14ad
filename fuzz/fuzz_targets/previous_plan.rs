//! A previous EPLB plan (`eplb --previous plan.json`): never a panic.
#![no_main]

use dualpipe_eplb::planner_io;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = planner_io::parse_previous(text);
    }
});
