//! EPLB loads as NumPy .npy (`eplb --loads x.npy`): any bytes, never a panic and never an
//! allocation the header asks for but the data does not back.
#![no_main]

use dualpipe_eplb::loads;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = loads::parse_npy(data);
});
