//! Phases: where a resource is, in a word, as `kubectl get` shows it. Each kind has its own
//! enum, declared with [`phases!`] (the CRD schema lists its values, so `kubectl explain`
//! does); a phase this version does not know (written by another version of the operator)
//! reads as none ([`known_or_none`]), so the object stays readable and the next status write
//! says its phase anew.

use serde::de::{Deserialize, DeserializeOwned, Deserializer};

/// Reads an optional phase, or none for one that is not a value of `T`.
pub(crate) fn known_or_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

/// Declares phase enum `$phase` (its doc and its variants', each a phase as `kubectl get` shows
/// it) with its names as text (`as_str`, `Display`).
macro_rules! phases {
    ($(#[$doc:meta])* $phase:ident { $($(#[$variant_doc:meta])* $variant:ident,)+ }) => {
        $(#[$doc])*
        #[derive(schemars::JsonSchema, serde::Deserialize, serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $phase {
            $($(#[$variant_doc])* $variant,)+
        }

        impl $phase {
            /// The phase as `kubectl get` shows it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)+
                }
            }
        }

        impl std::fmt::Display for $phase {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use phases;

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    phases! {
        /// A traffic light's.
        Light {
            Green,
            Red,
        }
    }

    #[derive(Deserialize, Debug)]
    struct Status {
        #[serde(default, deserialize_with = "known_or_none")]
        phase: Option<Light>,
    }

    #[test]
    fn a_known_phase_is_read_an_unknown_one_is_none_and_names_are_the_variants() {
        let read = |json: &str| serde_json::from_str::<Status>(json).unwrap().phase;
        assert_eq!(read(r#"{"phase":"Red"}"#), Some(Light::Red));
        assert_eq!(read(r#"{"phase":"Amber"}"#), None);
        assert_eq!(read(r#"{"phase":null}"#), None);
        assert_eq!(read("{}"), None);
        assert_eq!(Light::Green.to_string(), "Green");
        assert_eq!(serde_json::to_value(Light::Green).unwrap(), "Green");
    }
}
