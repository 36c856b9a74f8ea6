//! Stored and shown words as enums: each variant's word once, with `as_str`,
//! `Display`, `ALL` and `parse`, serialized as the word (and described so in the
//! API's OpenAPI document).

/// Words with `as_str`, `Display`, a list of all of them and a parse, serialized
/// as their word.
macro_rules! words {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $word:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        // Not every list of words needs all three: each may go unused.
        #[allow(dead_code)]
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }

            pub fn parse(word: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|w| w.as_str() == word)
            }
        }

        /// Serialized as its word, the same text that is stored and shown.
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        /// Stored as its word.
        impl From<$name> for bson::Bson {
            fn from(w: $name) -> bson::Bson {
                bson::Bson::String(w.as_str().to_string())
            }
        }

        /// In the API's OpenAPI document: a string, one of the words.
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$($word,)+]))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use words;
