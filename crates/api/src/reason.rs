//! Condition reasons: each kind has its own enum, declared with [`reasons!`], and its CRD
//! schema lists them as the values `status.conditions[].reason` may take, so `kubectl explain`
//! shows them and a client (the plugin, a user's alert) can match on a reason knowing the
//! operator says it. The operator can only say a reason its kind's enum has: a condition is
//! decided with a value of the enum, never with text.
//!
//! Every kind has `spec.paused` and the `Paused` condition, so every enum has its two reasons,
//! `Paused` and `NotPaused`, which the macro adds.

use schemars::{JsonSchema, Schema, SchemaGenerator};

/// A kind's condition reasons (made by [`reasons!`]).
pub trait Reason: Copy + std::fmt::Debug + PartialEq + Send + Sync + 'static {
    /// `spec.paused` is true.
    const PAUSED: Self;
    /// `spec.paused` is false.
    const NOT_PAUSED: Self;
    /// Every reason, in declaration order, as the CRD schema lists them.
    const ALL: &'static [&'static str];

    /// The reason as a condition says it.
    fn as_str(self) -> &'static str;
}

/// The schema of `status.conditions` of a kind whose reasons are `R`: the Kubernetes condition,
/// with `reason` one of `R`'s values.
pub fn conditions_schema<R: Reason>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = Vec::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>::json_schema(generator);
    if let Some(reason) = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(|properties| properties.get_mut("reason"))
        .and_then(|reason| reason.as_object_mut())
    {
        reason.insert("enum".into(), R::ALL.to_vec().into());
    }
    schema
}

/// Declares reason enum `$reason` (its doc and its variants', each a reason as a condition
/// says it), with `Paused` and `NotPaused` first; it implements [`Reason`], `Display`, and
/// `conditions_schema` for `#[schemars(schema_with = ...)]` on the status's conditions.
macro_rules! reasons {
    ($(#[$doc:meta])* $reason:ident { $($(#[$variant_doc:meta])* $variant:ident,)+ }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $reason {
            /// `spec.paused` is true: the operator changes nothing of it.
            Paused,
            /// `spec.paused` is false: the operator manages it.
            NotPaused,
            $($(#[$variant_doc])* $variant,)+
        }

        impl $reason {
            /// The reason as a condition says it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    Self::Paused => "Paused",
                    Self::NotPaused => "NotPaused",
                    $(Self::$variant => stringify!($variant),)+
                }
            }

            /// The reason called `name`, if this kind has one so called (a pod's own reason,
            /// `ImagePullBackOff`, said again when the kind lists it).
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    "Paused" => Some(Self::Paused),
                    "NotPaused" => Some(Self::NotPaused),
                    $(stringify!($variant) => Some(Self::$variant),)+
                    _ => None,
                }
            }

            /// The schema of `status.conditions` with these reasons.
            pub fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                $crate::reason::conditions_schema::<Self>(generator)
            }
        }

        impl $crate::reason::Reason for $reason {
            const PAUSED: Self = Self::Paused;
            const NOT_PAUSED: Self = Self::NotPaused;
            const ALL: &'static [&'static str] = &["Paused", "NotPaused", $(stringify!($variant),)+];

            fn as_str(self) -> &'static str {
                $reason::as_str(self)
            }
        }

        impl From<$reason> for String {
            fn from(reason: $reason) -> String {
                reason.as_str().into()
            }
        }

        impl std::fmt::Display for $reason {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use reasons;

#[cfg(test)]
mod tests {
    use super::*;

    reasons! {
        /// A traffic light's.
        LightReason {
            Green,
            Red,
        }
    }

    #[test]
    fn every_reason_is_listed_by_its_name_and_the_schema_says_only_those() {
        assert_eq!(LightReason::ALL, ["Paused", "NotPaused", "Green", "Red"]);
        assert_eq!(LightReason::Red.as_str(), "Red");
        assert_eq!(LightReason::Green.to_string(), "Green");
        assert_eq!(LightReason::from_name("Red"), Some(LightReason::Red));
        assert_eq!(LightReason::from_name("Amber"), None);
        assert_eq!(LightReason::NOT_PAUSED.to_string(), "NotPaused");
        let mut generator = schemars::generate::SchemaSettings::openapi3()
            .with(|s| s.inline_subschemas = true)
            .into_generator();
        let schema = LightReason::conditions_schema(&mut generator);
        let reason = &schema.as_value()["items"]["properties"]["reason"];
        assert_eq!(
            reason["enum"],
            serde_json::json!(["Paused", "NotPaused", "Green", "Red"]),
            "{schema:?}"
        );
        assert_eq!(reason["type"], "string");
    }
}
