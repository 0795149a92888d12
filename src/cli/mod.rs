//! The command line's own pieces: what it shows while a command works.
//! (The library prints nothing; everything a person sees is drawn here.)

pub mod progress;
