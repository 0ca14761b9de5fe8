//! The `vocabulary!` macro: closed sets of names.

/// Declares a closed vocabulary (names stored in manifests or accepted by
/// the APIs): an enum with its lowercase names, `ALL`, `name()`,
/// `names()` and `parse()`, serialised by name.
macro_rules! vocabulary_impl {
    ($(#[$m:meta])* $vis:vis enum $T:ident : $what:literal { $($(#[$vm:meta])* $V:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        $vis enum $T {
            $($(#[$vm])* #[serde(rename = $s)] $V),+
        }
        impl $T {
            /// Every value, in declaration order.
            pub const ALL: &'static [$T] = &[$($T::$V),+];
            /// The name stored in manifests and accepted by the APIs.
            pub fn name(self) -> &'static str {
                match self { $($T::$V => $s),+ }
            }
            /// Parses a name (case-insensitive, surrounding spaces ignored).
            pub fn parse(s: &str) -> $crate::Result<$T> {
                let t = s.trim().to_ascii_lowercase();
                $(if t == $s { return Ok($T::$V); })+
                Err($crate::Error::arg(format!(
                    "unknown {} {:?}: expected one of {}",
                    $what,
                    s,
                    Self::names().join(", ")
                )))
            }
            /// Every name, in declaration order.
            pub fn names() -> Vec<&'static str> {
                Self::ALL.iter().map(|x| x.name()).collect()
            }
        }
        impl std::fmt::Display for $T {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

pub(crate) use vocabulary_impl as vocabulary;
