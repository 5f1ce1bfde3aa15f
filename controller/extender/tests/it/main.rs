//! The extender's integration tests, one binary: over a real TCP socket (`http`), the
//! node cache and verbs against an in-memory cluster (`state`), the webhook over TLS
//! (`webhook`), and the attacks on its protections (`auth`).

mod auth;
mod http;
mod state;
mod support;
mod webhook;
