//! Demonstration of what the framework has so far.
fn main() {}
