from django.urls import path

from cleanup.observability import views

urlpatterns = [
    path("metrics", views.metrics, name="cleanup-metrics"),
    path("health", views.health, name="cleanup-health"),
]
