"""A small real Django project using leafpool.orm.django (settings, URLs, the admin)."""
