-- Actors made through the E2B-compatible API are indexed by their sandbox
-- ID (their name), which routers resolve without a space: the unique index
-- keeps an ID to one actor across all spaces. Other actors hold '' and are
-- not in the index. No existing actor is a sandbox, so the default is
-- every row's value.

ALTER TABLE actors ADD COLUMN sandbox {{text}} NOT NULL DEFAULT '';
CREATE UNIQUE INDEX actors_sandbox ON actors (sandbox) WHERE sandbox <> '';
