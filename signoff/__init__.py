"""What a program outside Signoff uses to work with it (the SDK-to-be): for now,
`signoff.hooks.verify`, a hook receiver's check of a delivery's signature."""
