//! A previous EPLB plan (`eplb --previous plan.json`): never a panic; an accepted placement is
//! checked against a layout without panicking either.
#![no_main]

use dualpipe_eplb::{Layout, PreviousPlacement};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(placement) = PreviousPlacement::parse_json(text) {
            // 4 experts, 8 slots, 2 groups, 2 nodes, 4 GPUs: the seed corpus's shape.
            let _ = placement.check(2, &Layout::new(4, 8, 2, 2, 4));
        }
    }
});
