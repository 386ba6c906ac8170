"""The API's request bodies (pydantic), converted at the boundary into the plain values
the manager's services take."""
