//! The domain's integration tests, one binary: every shipped fake profile through the fake
//! backend (`backend_profiles`), and the CDI spec of a claim on a profile's GPUs
//! (`cdi_spec`, feature `cdi`).

mod backend_profiles;
#[cfg(feature = "cdi")]
mod cdi_spec;
