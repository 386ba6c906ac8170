"""Sessions (spec 05, 07): :mod:`.spec`, the request as the session service takes it
(:class:`~.spec.SessionRequest`) and its pure checks."""
