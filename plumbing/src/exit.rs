//! Exit statuses and the one-line error report of every fgpu binary.
//!
//! `0` success, [`FAILURE`] (1) for a failure, [`BAD_INPUT`] (2) when the user's input is
//! wrong (a flag, a file, a profile): the caller can fix it, retrying will not help.

use std::error::Error;
use std::process::ExitCode;

/// Exit status of a failure.
pub const FAILURE: u8 = 1;
/// Exit status of bad input.
pub const BAD_INPUT: u8 = 2;

/// An error the user's input caused (exit status [`BAD_INPUT`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

impl BadInput {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// `err` and its causes on one line, `outer: inner: ...`, newlines folded.
pub fn one_line(err: &(dyn Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line.replace('\n', " ")
}

/// Whether `err` or any of its causes satisfies `is`.
pub fn any_cause(err: &(dyn Error + 'static), is: impl Fn(&(dyn Error + 'static)) -> bool) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if is(e) {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Prints `error: <err on one line>` on stderr and picks the exit status: [`BAD_INPUT`]
/// when a cause is [`BadInput`] or `also_bad_input` says so, else [`FAILURE`].
pub fn report(
    err: &(dyn Error + 'static),
    also_bad_input: impl Fn(&(dyn Error + 'static)) -> bool,
) -> ExitCode {
    eprintln!("error: {}", one_line(err));
    let bad = any_cause(err, |e| {
        e.downcast_ref::<BadInput>().is_some() || also_bad_input(e)
    });
    ExitCode::from(if bad { BAD_INPUT } else { FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading the profile")]
    struct Outer(#[source] BadInput);

    #[test]
    fn the_chain_is_one_line_and_bad_input_is_found_in_it() {
        let e = Outer(BadInput::new("line 3:\ncolumn 2"));
        assert_eq!(one_line(&e), "reading the profile: line 3: column 2");
        assert!(any_cause(&e, |c| c.downcast_ref::<BadInput>().is_some()));
        let plain = std::io::Error::other("disk full");
        assert!(!any_cause(&plain, |c| c
            .downcast_ref::<BadInput>()
            .is_some()));
    }
}
