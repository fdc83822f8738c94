#!/usr/bin/env python
"""The Django project of leafpool's ORM tests (tests/orm/test_django.py runs it):
``python manage.py test shop`` with SHOP_DATABASE_URL and SHOP_REDIS_URL set."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "leafsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
