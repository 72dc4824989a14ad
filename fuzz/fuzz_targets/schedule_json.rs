//! Schedule JSON import (`--schedule-file x.json`, through `format::read_schedule`): any bytes
//! give a schedule or an error, never a panic; an accepted schedule re-exports to JSON that reads
//! back equal.
#![no_main]

use dualpipe_schedule::format::{json, read_schedule};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(schedule) = read_schedule(text, "fuzz.json") {
        let again = read_schedule(&json::to_string(&schedule), "again.json")
            .expect("an accepted schedule's JSON reads back");
        assert_eq!(again, schedule);
    }
});
