from django.contrib import admin
from django.urls import path

from memory_site.views import home

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
]
