from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from memory_site.views import home

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("api/memory/", include("persistent_memory.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]

# JSON errors on the API's paths even when Django answers before a view (a bad Host, a
# body too big, the database down in a middleware); a 503 page for a database outage.
handler400 = "persistent_memory.api.error_views.bad_request"
handler403 = "persistent_memory.api.error_views.permission_denied"
handler404 = "persistent_memory.api.error_views.page_not_found"
handler500 = "persistent_memory.api.error_views.server_error"
