//! Schedule JSON import (`--schedule-file x.json`): any bytes give a schedule or an error, never a
//! panic; an accepted schedule passed the validator and re-exports to JSON that reads back equal.
#![no_main]

use dualpipe_schedule::format::json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(schedule) = json::from_str(text) {
        let again = json::from_str(&json::to_string(&schedule)).expect("re-export reads back");
        assert_eq!(again.programs, schedule.programs);
    }
});
