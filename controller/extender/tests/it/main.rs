//! The extender's integration tests, one binary: over a real TCP socket (`http`), the
//! node cache and verbs against an in-memory cluster (`state`), the webhook over TLS
//! (`webhook`).

mod http;
mod state;
mod support;
mod webhook;
