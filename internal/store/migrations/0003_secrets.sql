-- Small values the control plane creates once and every replica shares:
-- the identity CA, token signing keys, hashed join tokens. data is stored
-- as given: encryption at rest is out of scope for now, so the database
-- and its backups must be protected like the keys they hold.

CREATE TABLE secrets (
    name        {{text}} PRIMARY KEY,
    data        {{bytes}} NOT NULL,
    create_time {{time}} NOT NULL
);
