//! torch compute-only CSV import (`--schedule-file x.csv`): any bytes give a schedule or an
//! error, never a panic.
#![no_main]

use dualpipe_schedule::format::csv;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(schedule) = csv::from_str(text, None) {
        let _ = csv::to_string(&schedule);
    }
});
