//! torch compute-only CSV import (`--schedule-file x.csv`, through `format::read_schedule`): any
//! bytes give a schedule or an error, never a panic.
#![no_main]

use dualpipe_schedule::format::{csv, read_schedule};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(schedule) = read_schedule(text, "fuzz.csv") {
        let _ = csv::to_string(&schedule);
    }
});
