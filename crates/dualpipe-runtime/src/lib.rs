//! Executes lowered pipeline schedules on real ranks.
