//! EPLB loads as CSV (`eplb --loads x.csv`): never a panic.
#![no_main]

use dualpipe_eplb::loads;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = loads::parse_csv(text);
    }
});
